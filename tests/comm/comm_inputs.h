// The collective tests' inputs now live beside the MPI probe, tools/comm/comm_inputs.h (a tool may
// not include test code). This forward stays only until tests/cuda/test_comm_nccl.cpp includes
// that header itself; then it goes.
#pragma once
#include "tools/comm/comm_inputs.h"
