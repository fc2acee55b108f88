// Open-addressing hash maps for the tokenizer's hot paths: string -> value (vocabulary, word cache)
// and uint64 -> value (BPE merge ranks). Insert-only, power-of-two tables, linear probing.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/hash.h"

namespace strata::tok {

// 64-bit hash of a byte string (8 bytes per step, multiply-xorshift mixing).
inline uint64_t hash_bytes(std::string_view s) {
  const uint64_t k = 0x9E3779B97F4A7C15ull;
  uint64_t h = s.size() * k;
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * k;
    h ^= h >> 29;
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * k;
    h ^= h >> 29;
  }
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

template <class V>
class FlatStrMap {
 public:
  size_t size() const { return size_; }

  const V* find(std::string_view key) const { return find(key, hash_bytes(key)); }
  const V* find(std::string_view key, uint64_t h) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.len == kEmpty) return nullptr;
      if (s.hash == h && s.len == key.size() && std::memcmp(keys_.data() + s.off, key.data(), key.size()) == 0)
        return &s.value;
    }
  }
  // Inserts or overwrites.
  void insert(std::string_view key, const V& value) { insert(key, hash_bytes(key), value); }
  void insert(std::string_view key, uint64_t h, const V& value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.len == kEmpty) {
        s = Slot{h, uint32_t(keys_.size()), uint32_t(key.size()), value};
        keys_.append(key);
        ++size_;
        return;
      }
      if (s.hash == h && s.len == key.size() && std::memcmp(keys_.data() + s.off, key.data(), key.size()) == 0) {
        s.value = value;
        return;
      }
    }
  }

 private:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0, len = kEmpty;
    V value{};
  };
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 16 : old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.len == kEmpty) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].len != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string keys_;
  size_t mask_ = 0, size_ = 0;
};

template <class V>
class FlatU64Map {
 public:
  size_t size() const { return size_; }
  const V* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = hash_mix64(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == key) return &s.value;
    }
  }
  void insert(uint64_t key, const V& value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    for (size_t i = hash_mix64(key) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!s.used) {
        s = Slot{key, value, true};
        ++size_;
        return;
      }
      if (s.key == key) {
        s.value = value;
        return;
      }
    }
  }

 private:
  struct Slot {
    uint64_t key = 0;
    V value{};
    bool used = false;
  };
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 16 : old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (!s.used) continue;
      size_t i = hash_mix64(s.key) & mask_;
      while (slots_[i].used) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

}  // namespace strata::tok
