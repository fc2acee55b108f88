// Binding a buffer-table row (EngineBuffer::bind, offload/stream/engine_buffers.h) to the pointer
// that receives the row's address once the arena is laid out: the engine's, the ZO engine's and
// the token scorer's tables. A null slot (a table built only to be sized) binds nothing.
#pragma once
#include <functional>

namespace strata {

template <class T>
std::function<void(void*)> bind_at(T** slot) {
  if (!slot) return {};
  return [slot](void* p) { *slot = static_cast<T*>(p); };
}

}  // namespace strata
