// Builds the host store and the engines from a RunPlan (run_engines.h).
#include "offload/plan/run_engines.h"

#include "src/core/error.h"

namespace strata {

std::unique_ptr<HostStore> run_plan_host_store(Device& dev, const ModelSpec& spec, const RunPlan& plan) {
  return std::make_unique<HostStore>(dev, spec, run_plan_store_options(plan));
}

std::unique_ptr<Engine> run_plan_engine(Device& dev, HostStore& store, const RunPlan& plan, LoraStore* lora) {
  STRATA_ASSERT(plan.optimizer_kind == OptimizerKind::adamw, "the first-order engine runs AdamW plans");
  STRATA_ASSERT(plan.lora.enabled() == (lora != nullptr), "a LoRA plan's engine needs the adapters' store");
  return std::make_unique<Engine>(dev, store, run_plan_engine_options(plan), lora);
}

std::unique_ptr<ZoEngine> run_plan_zo_engine(Device& dev, HostStore& store, const RunPlan& plan) {
  STRATA_ASSERT(plan.optimizer_kind == OptimizerKind::zo_sgd, "the zeroth-order engine runs ZO-SGD plans");
  return std::make_unique<ZoEngine>(dev, store, run_plan_engine_options(plan));
}

std::unique_ptr<Generator> run_plan_generator(Device& dev, HostStore& store, const RunPlan& plan) {
  STRATA_ASSERT(plan.generation.active, "the generator runs generation plans");
  return std::make_unique<Generator>(dev, store, plan.generation.shape, plan.generation.placement);
}

}  // namespace strata
