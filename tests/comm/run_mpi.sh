#!/bin/sh
# Runs strata_comm_probe under `mpirun -np N` for ctest (src/comm/comm.cmake, label mpi).
#   run_mpi.sh PROBE N ARGS...                    passes when every rank passes
#   run_mpi.sh --expect-fail REGEX PROBE N ARGS... passes when the job exits non-zero and its
#                                                  output matches REGEX (a fault test)
# Exit 77 (ctest SKIP_RETURN_CODE) with the reason when mpirun cannot start processes here.
# Runs as root too (OpenMPI's own allow flags) and oversubscribed (more ranks than cores).
expect=""
if [ "$1" = "--expect-fail" ]; then expect="$2"; shift 2; fi
probe="$1"; np="$2"; shift 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Containers often forbid the cross-process memory attach of the shared-memory transport.
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl="self,vader"
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIPPED: mpirun not found (install openmpi-bin: scripts/setup.sh)"; exit 77
fi
if ! out=$(timeout 60 mpirun -np "$np" true 2>&1); then
  echo "SKIPPED: mpirun cannot start $np processes here: $out"; exit 77
fi
log=$(mktemp)
start=$(date +%s)
timeout 120 mpirun -np "$np" "$probe" "$@" >"$log" 2>&1
rc=$?
end=$(date +%s)
cat "$log"
echo "run_mpi.sh: mpirun -np $np $(basename "$probe") $*: exit $rc after $((end - start)) s"
if [ $rc -eq 124 ]; then echo "FAILED: the job hung (killed by timeout after 120 s)"; rm -f "$log"; exit 1; fi
if [ -z "$expect" ]; then rm -f "$log"; exit $rc; fi
if [ $rc -eq 0 ]; then echo "FAILED: expected a non-zero exit"; rm -f "$log"; exit 1; fi
if ! grep -Eq "$expect" "$log"; then echo "FAILED: no line matches /$expect/"; rm -f "$log"; exit 1; fi
rm -f "$log"
echo "as expected: non-zero exit and /$expect/"
