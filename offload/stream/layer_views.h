// A layer's tensors inside a block laid out as its parameter group (in its kind's parameter order), from the store's layout alone
// (nothing allocated): strata estimate's layer probe (src/cli/cmd_estimate.cpp) runs a layer on a
// CPU device with these. The store-based views the engine uses are in offload/stream/weight_stream.h;
// both are implemented in offload/stream/weight_stream.cpp.
#pragma once
#include <cstddef>

#include "models/layer_kind.h"
#include "offload/state/host_store.h"

namespace strata {

LayerTensors layer_weights_in(const ModelSpec& spec, const HostStoreLayout& layout, const char* base, size_t layer);
LayerGradTensors layer_grads_in(const ModelSpec& spec, const HostStoreLayout& layout, char* base, size_t layer);

}  // namespace strata
