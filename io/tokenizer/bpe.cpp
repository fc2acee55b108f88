// BPE model: loading from tokenizer.json, the merge loop and the word cache (see bpe.h).
#include "io/tokenizer/bpe.h"

#include <cstdio>
#include <algorithm>
#include <atomic>
#include <iterator>
#include <functional>

#include "io/json.h"
#include "io/tokenizer/text.h"
#include "src/core/error.h"

namespace strata::tok {

std::unique_ptr<BpeModel> BpeModel::from_json(const nlohmann::json& j) {
  static std::atomic<uint64_t> serials{0};
  auto m = std::make_unique<BpeModel>();
  m->serial_ = ++serials;
  if (j.contains("dropout") && !j["dropout"].is_null())
    STRATA_CHECK(j["dropout"].get<double>() == 0.0, "tokenizer.json: BPE dropout is not supported (it makes "
                                                     "tokenization random); set \"dropout\": null");
  auto opt_string = [&](const char* key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  m->prefix_ = opt_string("continuing_subword_prefix");
  m->suffix_ = opt_string("end_of_word_suffix");
  m->fuse_unk_ = j.value("fuse_unk", false);
  m->byte_fallback_ = j.value("byte_fallback", false);
  m->ignore_merges_ = j.value("ignore_merges", false);

  const auto& vocab = j.at("vocab");
  STRATA_CHECK(vocab.is_object(), "tokenizer.json: BPE \"vocab\" must be an object of token -> id");
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int64_t id = it.value().get<int64_t>();
    STRATA_CHECK(id >= 0 && id < (int64_t(1) << 31), "tokenizer.json: vocab id ", id, " of \"", it.key(),
                 "\" is out of range");
    max_id = std::max(max_id, id);
  }
  m->vocab_r_.resize(size_t(max_id + 1));
  m->has_id_.assign(size_t(max_id + 1), 0);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int32_t id = it.value().get<int32_t>();
    m->vocab_.insert(it.key(), id);
    m->vocab_r_[id] = it.key();
    m->has_id_[id] = 1;
  }

  std::string unk = opt_string("unk_token");
  if (!unk.empty()) {
    m->unk_id_ = m->token_to_id(unk);
    STRATA_CHECK(m->unk_id_ >= 0, "tokenizer.json: BPE unk_token \"", unk, "\" is not in the vocabulary");
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    m->byte_ids_[b] = m->token_to_id(name);
  }

  const auto& merges = j.at("merges");
  STRATA_CHECK(merges.is_array(), "tokenizer.json: BPE \"merges\" must be an array");
  int32_t rank = 0;
  for (const auto& mj : merges) {
    std::string a, b;
    if (mj.is_string()) {
      const std::string& s = mj.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      STRATA_CHECK(sp != std::string::npos, "tokenizer.json: merge ", rank, " \"", s, "\" is not \"left right\"");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      STRATA_CHECK(mj.is_array() && mj.size() == 2, "tokenizer.json: merge ", rank, " is neither \"a b\" nor [a, b]");
      a = mj[0].get<std::string>(), b = mj[1].get<std::string>();
    }
    int32_t ia = m->token_to_id(a), ib = m->token_to_id(b);
    STRATA_CHECK(ia >= 0 && ib >= 0, "tokenizer.json: merge ", rank, " uses a token missing from the vocabulary: \"",
                 ia < 0 ? a : b, "\"");
    STRATA_CHECK(b.size() >= m->prefix_.size(), "tokenizer.json: merge ", rank, " right side \"", b,
                 "\" is shorter than continuing_subword_prefix");
    std::string merged = a + b.substr(m->prefix_.size());
    int32_t id = m->token_to_id(merged);
    STRATA_CHECK(id >= 0, "tokenizer.json: merge ", rank, " makes \"", merged, "\", which is not in the vocabulary");
    m->merges_.insert(uint64_t(uint32_t(ia)) << 32 | uint32_t(ib), Merge{rank, id});
    ++rank;
  }
  return m;
}

void BpeModel::tokenize(std::string_view word, std::vector<BpeToken>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const int32_t* id = vocab_.find(word)) {
      out->push_back({*id, uint32_t(word.size())});
      return;
    }
  }
  if (word.size() > kCacheMaxWordBytes) {
    tokenize_long(word, out);
    return;
  }
  tokenize_cached(word, out);
}

void BpeModel::tokenize_cached(std::string_view word, std::vector<BpeToken>* out) const {
  if (word.size() > kCacheMaxWordBytes) {
    merge_word(word, out);
    return;
  }
  uint64_t h = hash_bytes(word);
  CacheShard& shard = cache_[h >> 60];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    if (const uint64_t* hit = shard.index.find(word, h)) {
      const BpeToken* t = shard.tokens.data() + (*hit >> 16);
      out->insert(out->end(), t, t + (*hit & 0xFFFF));
      return;
    }
  }
  size_t first = out->size();
  merge_word(word, out);
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.index.size() < kCacheMaxWords && !shard.index.find(word, h)) {
    uint64_t off = shard.tokens.size();
    shard.tokens.insert(shard.tokens.end(), out->begin() + first, out->end());
    shard.index.insert(word, h, off << 16 | uint64_t(out->size() - first));
  }
}

bool BpeModel::boundary_is_safe(uint32_t c1, std::string_view s1, uint32_t c2, std::string_view s2) const {
  if (!vocab_.find(s1) || !vocab_.find(s2)) return false;  // would become byte-fallback or unk symbols
  return !std::binary_search(inner_pairs_.begin(), inner_pairs_.end(), uint64_t(c1) << 32 | c2);
}

void BpeModel::tokenize_long(std::string_view w, std::vector<BpeToken>* out) const {
  if (!prefix_.empty() || !suffix_.empty()) {  // affixes change symbol strings; no cutting
    merge_word(w, out);
    return;
  }
  std::call_once(pairs_once_, [this] {
    for (const std::string& t : vocab_r_) {
      uint32_t prev = 0;
      for (size_t i = 0; i < t.size();) {
        size_t len;
        uint32_t cp = utf8_decode(t.data(), i, &len);
        if (i > 0) inner_pairs_.push_back(uint64_t(prev) << 32 | cp);
        prev = cp;
        i += len;
      }
    }
    std::sort(inner_pairs_.begin(), inner_pairs_.end());
    inner_pairs_.erase(std::unique(inner_pairs_.begin(), inner_pairs_.end()), inner_pairs_.end());
  });
  // Direct-mapped per-thread memo of boundary_is_safe: text repeats few character pairs.
  struct Memo {
    uint64_t serial = 0;
    uint64_t key[4096];
    uint8_t safe[4096];
  };
  thread_local Memo memo;
  if (memo.serial != serial_) {
    memo.serial = serial_;
    std::fill(std::begin(memo.key), std::end(memo.key), 0);
  }
  size_t part = 0, prev_i = 0;
  uint32_t prev_cp = 0;
  for (size_t i = 0; i < w.size();) {
    size_t len;
    uint32_t cp = utf8_decode(w.data(), i, &len);
    bool safe = false;
    if (i > 0) {
      uint64_t key = (uint64_t(prev_cp) << 32 | cp) + 1;
      size_t slot = hash_mix64(key) & 4095;
      if (memo.key[slot] != key) {
        memo.key[slot] = key;
        memo.safe[slot] = boundary_is_safe(prev_cp, w.substr(prev_i, i - prev_i), cp, w.substr(i, len));
      }
      safe = memo.safe[slot];
    }
    if (safe) {
      tokenize_cached(w.substr(part, i - part), out);
      part = i;
    }
    prev_cp = cp, prev_i = i;
    i += len;
  }
  tokenize_cached(w.substr(part), out);
}

void BpeModel::merge_word(std::string_view w, std::vector<BpeToken>* out) const {
  struct Symbol {
    int32_t id;
    uint32_t len;
    int32_t prev, next;
  };
  thread_local std::vector<Symbol> sym;
  thread_local std::string piece;
  sym.clear();

  // Initial symbols: one per character (with the affixes), byte-fallback or unk when unknown.
  int32_t unk_pending = -1;
  uint32_t unk_len = 0;
  auto push = [&](int32_t id, uint32_t len) {
    int32_t i = int32_t(sym.size());
    sym.push_back({id, len, i - 1, i + 1});
  };
  for (size_t i = 0; i < w.size();) {
    size_t n = utf8_char_len((unsigned char)w[i]);
    bool is_first = i == 0, is_last = i + n >= w.size();
    std::string_view s = w.substr(i, n);
    if ((!is_first && !prefix_.empty()) || (is_last && !suffix_.empty())) {
      piece.clear();
      if (!is_first) piece += prefix_;
      piece += s;
      if (is_last) piece += suffix_;
      s = piece;
    }
    if (const int32_t* id = vocab_.find(s)) {
      if (unk_pending >= 0) push(unk_pending, unk_len), unk_pending = -1;
      push(*id, uint32_t(n));
    } else {
      bool fell_back = false;
      if (byte_fallback_) {
        fell_back = true;
        for (unsigned char c : s) fell_back &= byte_ids_[c] >= 0;
        if (fell_back) {
          // Hugging Face gives every byte token length 1 (of the piece, affixes included).
          for (unsigned char c : s) push(byte_ids_[c], 1);
        }
      }
      if (!fell_back && unk_id_ >= 0) {
        if (unk_pending >= 0 && fuse_unk_) {
          unk_len += uint32_t(n);
        } else {
          if (unk_pending >= 0) push(unk_pending, unk_len);
          unk_pending = unk_id_, unk_len = uint32_t(n);
        }
      }
    }
    i += n;
  }
  if (unk_pending >= 0) push(unk_pending, unk_len);
  if (sym.empty()) return;
  sym.back().next = -1;

  // Merge loop: a min-heap of (rank, position); stale entries are recognised and skipped.
  struct Cand {
    int32_t rank, pos, new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Cand> heap;
  heap.clear();
  auto lookup = [&](int32_t a, int32_t b) { return merges_.find(uint64_t(uint32_t(a)) << 32 | uint32_t(b)); };
  auto heap_push = [&](Cand c) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), std::greater<Cand>());
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i)
    if (const Merge* m = lookup(sym[i].id, sym[i + 1].id)) heap.push_back({m->rank, int32_t(i), m->new_id});
  std::make_heap(heap.begin(), heap.end(), std::greater<Cand>());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Cand>());
    Cand top = heap.back();
    heap.pop_back();
    Symbol& cur = sym[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    Symbol& right = sym[cur.next];
    const Merge* m = lookup(cur.id, right.id);
    if (!m || m->new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    right.len = 0;
    cur.next = right.next;
    if (cur.next >= 0) sym[cur.next].prev = top.pos;
    if (cur.prev >= 0)
      if (const Merge* pm = lookup(sym[cur.prev].id, cur.id)) heap_push({pm->rank, cur.prev, pm->new_id});
    if (cur.next >= 0)
      if (const Merge* nm = lookup(cur.id, sym[cur.next].id)) heap_push({nm->rank, top.pos, nm->new_id});
  }
  for (const Symbol& s : sym)
    if (s.len != 0) out->push_back({s.id, s.len});
}

}  // namespace strata::tok
