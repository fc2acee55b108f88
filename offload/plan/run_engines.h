// The host store and the engines, built from a RunPlan alone (offload/plan/placement_plan.h):
// what the trainer, the CLI's one-shot commands (strata grad, strata zo-probe), `strata
// generate` and the tools construct, so none of them assembles an engine's options itself.
#pragma once
#include <memory>

#include "offload/engine/engine.h"
#include "offload/engine/engine_zo.h"
#include "offload/engine/generator.h"
#include "offload/plan/placement_plan.h"

namespace strata {

// The store the plan counted: the optimizer's arrays in RAM or on NVMe (the plan's tier).
std::unique_ptr<HostStore> run_plan_host_store(Device& dev, const ModelSpec& spec, const RunPlan& plan);
// The first-order engine (AdamW, or LoRA-AdamW with `lora`), and the zeroth-order one.
std::unique_ptr<Engine> run_plan_engine(Device& dev, HostStore& store, const RunPlan& plan, LoraStore* lora = nullptr);
std::unique_ptr<ZoEngine> run_plan_zo_engine(Device& dev, HostStore& store, const RunPlan& plan);
// The generator of a generation plan (placement_generation_plan): its shape and placement.
std::unique_ptr<Generator> run_plan_generator(Device& dev, HostStore& store, const RunPlan& plan);

}  // namespace strata
