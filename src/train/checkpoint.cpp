#include "src/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/checksum.h"
#include "io/files.h"
#include "io/safetensors.h"
#include "models/lora_adapter.h"
#include "offload/state/lora.h"
#include "offload/state/model_io.h"
#include "src/core/error.h"
#include "src/core/fault.h"

namespace strata {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kMarker = "COMPLETE";
constexpr const char* kStateFile = "optimizer_state.safetensors";
constexpr const char* kManifest = "manifest.json";
constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                          "chat_template.jinja", "tokenizer.model", "vocab.json", "merges.txt"};


// fsync every file and directory under root, children before parents.
void fsync_tree(const fs::path& root) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    it->is_directory() ? fsync_dir(it->path().string()) : fsync_file(it->path().string());
  STRATA_CHECK_IO(!ec, "cannot list ", root.string(), ": ", ec.message());
  fsync_dir(root.string());
}

std::string read_file(const fs::path& p) { return file_read(p.string(), "checkpoint file"); }

void write_text(const fs::path& p, const std::string& text) { file_write_atomic(p.string(), text); }

void copy_into(const std::string& from_dir, const char* name, const fs::path& to_dir) {
  if (from_dir.empty()) return;
  fs::path src = fs::path(from_dir) / name;
  std::error_code ec;
  if (!fs::is_regular_file(src, ec)) return;
  write_text(to_dir / name, read_file(src));
}

// The merged model of an NF4 base (offload/state/nf4_layout.h), which cannot hold merged weights
// (set_param would quantize them again): written tensor by tensor as model_save_hf writes, each
// adapted weight its dequantized bf16 values + (alpha / r) B A in f32, rounded once to dtype.
void save_hf_merged_nf4(const HostStore& store, const LoraStore& lora, const std::string& dir, DType dtype) {
  const ModelSpec& spec = store.spec();
  const LoraLayout& l = lora.layout();
  const std::vector<LoraMergeTerm> terms = lora_merge_terms(spec, l);
  std::vector<int64_t> term_of(spec.params.size(), kAbsent);  // parameter row -> its adapter's merge term
  for (size_t i = 0; i < terms.size(); ++i) term_of[terms[i].param_row] = int64_t(i);
  std::error_code ec;
  fs::create_directories(dir, ec);
  STRATA_CHECK_IO(!ec, "cannot create output directory ", dir, ": ", ec.message());
  std::vector<float> values;
  std::vector<char> converted;
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const TensorSpec& r = spec.params[i];
    TensorToWrite t(r.name, dtype, r.shape, static_cast<const void*>(nullptr));
    t.stream = [&, i](const TensorSink& write) {
      const TensorSpec& p = spec.params[i];
      values.resize(size_t(p.numel()));
      store.get_param(i, values.data());
      if (const int64_t m = term_of[i]; m != kAbsent)
        lora_merge_weight(values.data(), lora.master() + terms[size_t(m)].a, lora.master() + terms[size_t(m)].b,
                          p.shape[0], p.shape[1], l.r, l.scale);
      converted.resize(values.size() * dtype_size(dtype));
      dtype_convert(converted.data(), dtype, values.data(), DType::f32, values.size());
      write(converted.data(), converted.size());
    };
    tensors.push_back(std::move(t));
  }
  safetensors_write_dir(dir, tensors, uint64_t(5) << 30);
  ModelConfig cfg = spec.config;
  cfg.raw["torch_dtype"] = dtype == DType::bf16 ? "bfloat16" : "float32";
  cfg.raw.erase("quantization_config");  // a pre-quantized base's: the merged model is not quantized
  hf_config_save(cfg, dir + "/config.json");
}

void write_hf(const HostStore& store, const fs::path& dir, DType dtype, const CheckpointFiles& files,
              const LoraStore* merge_nf4 = nullptr) {
  if (merge_nf4) save_hf_merged_nf4(store, *merge_nf4, dir.string(), dtype);
  else model_save_hf(store, dir.string(), dtype);
  for (const char* name : kTokenizerFiles) copy_into(files.tokenizer_dir, name, dir);
  copy_into(files.model_dir, "generation_config.json", dir);
  if (!files.chat_template.empty() && !files.tokenizer_dir.empty()) {
    const fs::path cfg = dir / "tokenizer_config.json";
    std::error_code ec;
    json j = json::object();
    if (fs::is_regular_file(cfg, ec)) j = json::parse(read_file(cfg), nullptr, false);
    if (!j.is_object()) j = json::object();
    if (!j.contains("chat_template") || j["chat_template"].is_null()) {
      j["chat_template"] = files.chat_template;
      write_text(cfg, j.dump(2) + "\n");
    }
  }
}

// ".<name><suffix>" (built with appends: GCC 12 warns falsely about "." + std::string)
std::string hidden_name(const std::string& name, const char* suffix) {
  std::string s = ".";
  s += name;
  s += suffix;
  return s;
}

void remove_quietly(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

// Moves a fully written temp dir to `dst`: fsync the tree, move any existing dst aside, rename,
// fsync the parent, drop what was moved aside.
void commit_dir(const fs::path& tmp, const fs::path& dst) {
  fsync_tree(tmp);
  const fs::path aside = dst.parent_path() / hidden_name(dst.filename().string(), ".old");
  std::error_code ec;
  remove_quietly(aside);
  if (fs::exists(dst, ec)) {
    fs::rename(dst, aside, ec);
    STRATA_CHECK_IO(!ec, "cannot move ", dst.string(), " aside: ", ec.message());
  }
  fs::rename(tmp, dst, ec);
  STRATA_CHECK_IO(!ec, "cannot rename ", tmp.string(), " to ", dst.string(), ": ", ec.message());
  fsync_dir(dst.parent_path().string());
  remove_quietly(aside);
}

int64_t checkpoint_step(const fs::path& p) {
  const std::string name = p.filename().string();
  const std::string prefix = "checkpoint-";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return -1;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (int64_t(1) << 50)) return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// Complete checkpoints under output_dir, oldest first.
std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    int64_t step = checkpoint_step(e.path());
    std::error_code ec2;
    if (step >= 0 && e.is_directory(ec2) && fs::is_regular_file(e.path() / kMarker, ec2))
      found.emplace_back(step, e.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Every regular file under root (relative paths, sorted), the manifest and marker excepted.
std::vector<std::string> files_under(const fs::path& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string rel = fs::relative(it->path(), root).generic_string();
    if (it->is_regular_file() && rel != kManifest && rel != kMarker) out.push_back(rel);
  }
  STRATA_CHECK_IO(!ec, "cannot list ", root.string(), ": ", ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

// manifest.json: size and CRC-32C of every file, read back from what was written, so resume
// can tell a damaged file from a good one.
void write_manifest(const fs::path& dir) {
  json files = json::array();
  for (const std::string& rel : files_under(dir)) {
    uint64_t bytes = 0;
    const uint32_t crc = crc32c_file((dir / rel).string(), &bytes);
    files.push_back({{"path", rel}, {"bytes", bytes}, {"crc32c", crc32c_hex(crc)}});
  }
  json m = {{"format", 1}, {"checksum", "crc32c"}, {"files", files}};
  write_text(dir / kManifest, m.dump(1) + "\n");
}

// What to do when a checkpoint is damaged: the older complete ones, newest first.
std::string older_advice(const fs::path& dir) {
  const int64_t step = checkpoint_step(dir);
  std::string older;
  auto all = complete_checkpoints(dir.parent_path().string());
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (it->first < step && older.size() < 400) older += (older.empty() ? "" : ", ") + it->second.string();
  if (older.empty())
    return "there is no older checkpoint in " + dir.parent_path().string() + ": start over with --overwrite";
  return "resume from an older checkpoint with --resume DIR (" + older + ") or start over with --overwrite";
}

// Checks every file the manifest lists: present, the size it had, the checksum it had.
void verify_manifest(const fs::path& dir) {
  const fs::path mpath = dir / kManifest;
  std::error_code ec;
  STRATA_CHECK(fs::is_regular_file(mpath, ec), mpath.string(), " is missing, so the checkpoint's files cannot be "
               "verified (a checkpoint written by an older strata, or damaged): ", older_advice(dir));
  json m;
  try {
    m = json::parse(read_file(mpath));
    for (const json& f : m.at("files")) {
      const std::string rel = f.at("path").get<std::string>();
      STRATA_CHECK(!rel.empty() && rel.find("..") == std::string::npos && rel.front() != '/', mpath.string(),
                   " names a file outside the checkpoint (", rel, "): the checkpoint is damaged; ", older_advice(dir));
      const fs::path p = dir / rel;
      STRATA_CHECK(fs::is_regular_file(p, ec), p.string(), " is missing: the checkpoint is damaged; ",
                   older_advice(dir));
      uint64_t bytes = 0;
      const std::string crc = crc32c_hex(crc32c_file(p.string(), &bytes));
      STRATA_CHECK(bytes == f.at("bytes").get<uint64_t>(), p.string(), " is damaged: it holds ", bytes,
                   " bytes but held ", f.at("bytes").get<uint64_t>(), " when it was saved; ", older_advice(dir));
      STRATA_CHECK(crc == f.at("crc32c").get<std::string>(), p.string(), " is damaged (its CRC-32C is ", crc,
                   ", the manifest says ", f.at("crc32c").get<std::string>(), "); ", older_advice(dir));
    }
  } catch (const json::exception& e) {
    STRATA_CHECK(false, mpath.string(), " is damaged (", e.what(), "); ", older_advice(dir));
  }
}

// The data position must index this checkpoint's rows: the order is a permutation of
// [0, rows) and the cursor within it.
void verify_data_position(const fs::path& dir, const TrainState& st) {
  const std::string where = (dir / "data_order.bin").string();
  STRATA_CHECK(st.rows > 0 && int64_t(st.order.size()) == st.rows, where, " holds ", st.order.size(),
               " row ids but the run had ", st.rows, " rows: the checkpoint is damaged; ", older_advice(dir));
  std::vector<bool> seen(size_t(st.rows), false);
  for (size_t i = 0; i < st.order.size(); ++i) {
    const int64_t r = st.order[i];
    STRATA_CHECK(r >= 0 && r < st.rows && !seen[size_t(r)], where, ": entry ", i, " is row ", r,
                 (r >= 0 && r < st.rows ? " a second time" : str_cat(", outside [0, ", st.rows, ")")),
                 ": the checkpoint is damaged; ", older_advice(dir));
    seen[size_t(r)] = true;
  }
  STRATA_CHECK(st.cursor <= st.order.size(), (dir / "trainer_state.json").string(), ": the data cursor (",
               st.cursor, ") is beyond the row order: the checkpoint is damaged; ", older_advice(dir));
  STRATA_CHECK(st.step >= 0 && st.epoch >= 0 && std::isfinite(st.tokens_seen),
               (dir / "trainer_state.json").string(), ": step, epoch or tokens_seen is out of range: the "
               "checkpoint is damaged; ", older_advice(dir));
}

}  // namespace

void export_hf_atomic(const HostStore& store, const std::string& dir, DType dtype, const CheckpointFiles& files) {
  const fs::path dst = fs::path(dir).lexically_normal();
  const fs::path tmp = dst.parent_path() / hidden_name(dst.filename().string(), ".tmp");
  std::error_code ec;
  fs::create_directories(dst.parent_path(), ec);
  STRATA_CHECK_IO(!ec, "cannot create ", dst.parent_path().string(), ": ", ec.message());
  remove_quietly(tmp);
  try {
    write_hf(store, tmp, dtype, files);
    commit_dir(tmp, dst);
  } catch (...) {
    remove_quietly(tmp);
    throw;
  }
}

void lora_export(const LoraStore& lora, HostStore& store, const std::string& dir, bool merge, DType dtype,
                 const CheckpointFiles& files) {
  const fs::path dst = fs::path(dir).lexically_normal() / "adapter";
  const fs::path tmp = dst.parent_path() / hidden_name("adapter", ".tmp");
  std::error_code ec;
  fs::create_directories(dst.parent_path(), ec);
  STRATA_CHECK_IO(!ec, "cannot create ", dst.parent_path().string(), ": ", ec.message());
  remove_quietly(tmp);
  try {
    lora.save_peft(tmp.string(), files.model_dir);
    for (const char* name : kTokenizerFiles) copy_into(files.tokenizer_dir, name, tmp);
    commit_dir(tmp, dst);
  } catch (...) {
    remove_quietly(tmp);
    throw;
  }
  if (!merge) return;
  if (store.packed()) {  // an NF4 base: merged as it is written (save_hf_merged_nf4)
    const fs::path merged = (fs::path(dir) / "merged").lexically_normal();
    const fs::path mtmp = merged.parent_path() / hidden_name("merged", ".tmp");
    remove_quietly(mtmp);
    try {
      write_hf(store, mtmp, dtype, files, &lora);
      commit_dir(mtmp, merged);
    } catch (...) {
      remove_quietly(mtmp);
      throw;
    }
    return;
  }
  lora_merge_into(store, lora);
  export_hf_atomic(store, (fs::path(dir) / "merged").string(), dtype, files);
}

namespace {

// The optimizer state's tensors for the checkpoint's state file: LoRA's adapters (master, m, v),
// or every parameter's master and, when the optimizer keeps them, moments in the run's dtype;
// each read from the state placement a piece at a time while the file is written.
std::vector<TensorToWrite> optimizer_state_tensors(const HostStore& store, const LoraStore* lora) {
  const ModelSpec& spec = store.spec();
  std::vector<TensorToWrite> tensors;
  if (lora) {  // LoRA: the adapters' state alone (the base is model.path, unchanged)
    const TensorTable& t = lora->layout().table;
    const LoraStore& ls = *lora;
    for (size_t i = 0; i < t.size(); ++i)
      for (StateArray a : {StateArray::master, StateArray::m, StateArray::v}) {
        const float* base = a == StateArray::master ? ls.master() : a == StateArray::m ? ls.m() : ls.v();
        tensors.emplace_back(std::string(state_array_name(a)) + "/" + t[i].name, DType::f32, t[i].shape,
                             static_cast<const void*>(base + t[i].offset / 4));
      }
  }
  for (size_t i = 0; !lora && i < spec.params.size(); ++i) {
    const TensorSpec& r = spec.params[i];
    for (StateArray a : {StateArray::master, StateArray::m, StateArray::v}) {
      if (!store.holds(a)) continue;  // zo-sgd: the master alone
      // the moments in the run's dtype (bf16 moments: as stored, so a resume is bit-exact)
      const DType dt = a == StateArray::master ? DType::f32 : store.moments_dtype();
      tensors.emplace_back(std::string(state_array_name(a)) + "/" + r.name, dt, r.shape,
                           [&store, a, i, dt](uint64_t offset, void* dst, size_t bytes) {
                             const size_t es = dtype_size(dt), n = bytes / es;
                             if (dt == DType::f32) {
                               store.read_state(a, i, int64_t(offset / es), int64_t(n), static_cast<float*>(dst));
                               return;
                             }
                             // bf16 values: widened, then narrowed back exactly, 64 KiB of f32 at a time
                             std::vector<float> wide(std::min<size_t>(n, size_t(1) << 14));
                             for (size_t k = 0; k < n; k += wide.size()) {
                               const size_t len = std::min(wide.size(), n - k);
                               store.read_state(a, i, int64_t(offset / es + k), int64_t(len), wide.data());
                               dtype_convert(static_cast<char*>(dst) + k * es, dt, wide.data(), DType::f32, len);
                             }
                           });
    }
  }
  return tensors;
}

}  // namespace

std::string checkpoint_save(const std::string& output_dir, const HostStore& store, const TrainState& state,
                            const std::string& recipe_toml, DType save_dtype, const CheckpointFiles& files,
                            int64_t keep_last, const LoraStore* lora) {
  const std::string name = "checkpoint-" + std::to_string(state.step);
  const fs::path dst = fs::path(output_dir) / name;
  const fs::path tmp = fs::path(output_dir) / hidden_name(name, ".tmp");
  remove_quietly(tmp);
  try {
    std::error_code ec;
    fs::create_directories(tmp, ec);
    STRATA_CHECK_IO(!ec, "cannot create ", tmp.string(), ": ", ec.message());

    // optimizer state: streamed from wherever it lives (RAM or NVMe) a piece at a time
    const std::vector<TensorToWrite> tensors = optimizer_state_tensors(store, lora);
    safetensors_write_file((tmp / kStateFile).string(), tensors, {{"step", std::to_string(state.step)}});

    json st = {{"step", state.step},           {"max_steps", state.max_steps}, {"rows", state.rows},
               {"data_hash", state.data_hash}, {"cursor", state.cursor},       {"epoch", state.epoch},
               {"rng", state.rng},             {"tokens_seen", state.tokens_seen},
               {"order_count", state.order.size()}, {"ranks", state.ranks},
               {"global_batch", state.global_batch}, {"micro_batch_size", state.micro_batch},
               {"gradient_accumulation_steps", state.accumulation}};
    fault_point("save");  // STRATA_FAULT=kill@save: the state file written, the rest not
    write_text(tmp / "trainer_state.json", st.dump(2) + "\n");
    file_write_atomic((tmp / "data_order.bin").string(), state.order.data(), state.order.size() * sizeof(int64_t));
    write_text(tmp / "recipe.toml", recipe_toml);
    if (lora) lora->save_peft((tmp / "adapter").string(), files.model_dir);
    else write_hf(store, tmp / "hf", save_dtype, files);
    write_manifest(tmp);  // before COMPLETE: a complete checkpoint always has one

    commit_dir(tmp, dst);
    json marker = {{"step", state.step}, {"unix_time", int64_t(std::time(nullptr))}};
    write_text(dst / kMarker, marker.dump() + "\n");
  } catch (...) {
    remove_quietly(tmp);
    throw;
  }

  if (keep_last > 0) {
    auto all = complete_checkpoints(output_dir);
    for (size_t i = 0; i + size_t(keep_last) < all.size(); ++i) {
      std::error_code ec;
      fs::remove_all(all[i].second, ec);
      if (ec)
        std::fprintf(stderr, "strata train: warning: cannot remove old checkpoint %s: %s\n",
                     all[i].second.c_str(), ec.message().c_str());
    }
  }
  return dst.string();
}

size_t checkpoint_bytes_estimate(const HostStore& store, DType save_dtype, size_t order_rows, const LoraStore* lora) {
  const size_t moments = store.needs().moments ? 2 * dtype_size(store.moments_dtype()) : 0;
  const size_t params = lora ? size_t(lora->layout().parameter_count()) : size_t(store.spec().parameter_count());
  // master + moments, and the export (hf/ in save_dtype; a PEFT adapter in f32)
  const size_t per_param = 4 + moments + (lora ? 4 : dtype_size(save_dtype));
  return params * per_param + order_rows * sizeof(int64_t) + (size_t(1) << 20);  // + the small files
}

std::string checkpoint_find_latest(const std::string& output_dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".checkpoint-", 0) == 0) remove_quietly(e.path());  // an interrupted save
  }
  auto all = complete_checkpoints(output_dir);
  return all.empty() ? std::string() : all.back().second.string();
}

namespace {

// One tensor of a checkpoint's state file into buf as f32, checked against the model's shape:
// f32, or (moments: `bf16_ok`) bf16, widened exactly.
void state_fetch(SafetensorsFile& f, const std::string& dir, const std::string& name, const TensorSpec& r,
                 std::vector<float>& buf, bool bf16_ok = false) {
  const SafetensorsEntry* e = f.find(name);
  STRATA_CHECK(e, dir, "/", kStateFile, " has no tensor ", name, ": the checkpoint belongs to another model");
  STRATA_CHECK((e->dtype == DType::f32 || (bf16_ok && e->dtype == DType::bf16)) && e->shape == r.shape, dir, "/",
               kStateFile, ": ", name, " is ", dtype_name(e->dtype), " ", safetensors_format_shape(e->shape),
               " but the model expects ", bf16_ok ? "f32 or bf16 " : "f32 ", safetensors_format_shape(r.shape));
  buf.resize(size_t(r.numel()));
  dtype_convert(buf.data(), DType::f32, f.data(*e), e->dtype, buf.size());
  f.release(*e);  // one tensor's file pages resident at a time (offload/plan/placement_plan.h)
}

// A checkpoint whose moments have another dtype than this run's (optim.moments_dtype) resumes
// with them converted, said once: bf16 -> f32 widens exactly; f32 -> bf16 rounds each moment to
// nearest even (the run goes on from slightly different moments than the saved run would have).
void note_moment_conversion(SafetensorsFile& f, const std::string& dir, const HostStore& store) {
  const SafetensorsEntry* e = store.spec().params.rows().empty() ? nullptr : f.find("exp_avg/" + store.spec().params[0].name);
  if (!e || !store.holds(StateArray::m) || e->dtype == store.moments_dtype()) return;
  std::fprintf(stderr, "strata train: %s holds %s AdamW moments and this run keeps %s (optim.moments_dtype): %s\n",
               dir.c_str(), dtype_name(e->dtype), dtype_name(store.moments_dtype()),
               e->dtype == DType::bf16 ? "widened exactly"
                                       : "each rounded to nearest even, so the run does not continue bit-exactly; set "
                                         "optim.moments_dtype = \"f32\" to resume it exactly");
}

// LoRA: the adapters' master and moments (the base stays as loaded from model.path).
void lora_state_load(SafetensorsFile& f, const std::string& dir, LoraStore& lora_store) {
  LoraStore* lora = &lora_store;
  std::vector<float> buf;
  auto fetch = [&](const std::string& name, const TensorSpec& r) { state_fetch(f, dir, name, r, buf); };
  const TensorTable& t = lora->layout().table;
  STRATA_CHECK(f.entries().size() == 3 * t.size(), dir, "/", kStateFile, " holds ", f.entries().size(),
               " tensors but this run's adapters have ", 3 * t.size(), " (master, exp_avg, exp_avg_sq per adapter "
               "tensor): the checkpoint belongs to another model or LoRA setting");
  for (size_t i = 0; i < t.size(); ++i)
    for (StateArray a : {StateArray::master, StateArray::m, StateArray::v}) {
      fetch(std::string(state_array_name(a)) + "/" + t[i].name, t[i]);
      float* base = a == StateArray::master ? lora->master() : a == StateArray::m ? lora->m() : lora->v();
      std::memcpy(base + t[i].offset / 4, buf.data(), buf.size() * 4);
    }
  lora->refresh_image();
}

}  // namespace

TrainState checkpoint_batch_split(const std::string& dir) {
  TrainState st;
  std::error_code ec;
  const fs::path file = fs::path(dir) / "trainer_state.json";
  if (!fs::is_regular_file(file, ec)) return st;
  const json j = json::parse(read_file(file), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return st;  // checkpoint_load names the damage
  try {
    st.ranks = j.value("ranks", int64_t(0));
    st.global_batch = j.value("global_batch", int64_t(0));
    st.micro_batch = j.value("micro_batch_size", int64_t(0));
    st.accumulation = j.value("gradient_accumulation_steps", int64_t(0));
  } catch (const json::exception&) {
    return TrainState{};  // likewise
  }
  return st;
}

TrainState checkpoint_load(const std::string& dir, HostStore& store, LoraStore* lora) {
  const fs::path d(dir);
  std::error_code ec;
  STRATA_CHECK(fs::exists(d, ec), "--resume ", dir, ": no such directory; give a checkpoint-<step> directory "
               "of an earlier run, or --resume auto for the newest one in checkpoint.output_dir");
  STRATA_CHECK(fs::is_directory(d, ec), "--resume ", dir, " is not a directory; give a checkpoint-<step> "
               "directory of an earlier run, or --resume auto");
  STRATA_CHECK(fs::is_regular_file(d / kMarker, ec), dir, " is not a complete checkpoint (no ", kMarker,
               " marker): its save did not finish; resume from an earlier one");
  verify_manifest(d);  // before anything is read: every byte below was checked
  TrainState st;
  try {
    json j = json::parse(read_file(d / "trainer_state.json"));
    st.step = j.at("step").get<int64_t>();
    st.max_steps = j.at("max_steps").get<int64_t>();
    st.rows = j.at("rows").get<int64_t>();
    st.data_hash = j.at("data_hash").get<uint64_t>();
    st.cursor = j.at("cursor").get<uint64_t>();
    st.epoch = j.at("epoch").get<int64_t>();
    st.rng = j.at("rng").get<std::string>();
    st.tokens_seen = j.at("tokens_seen").get<double>();
    st.ranks = j.value("ranks", int64_t(0));  // absent before the rank count was recorded
    st.global_batch = j.value("global_batch", int64_t(0));
    st.micro_batch = j.value("micro_batch_size", int64_t(0));
    st.accumulation = j.value("gradient_accumulation_steps", int64_t(0));
    const size_t count = j.at("order_count").get<size_t>();
    std::string order = read_file(d / "data_order.bin");
    STRATA_CHECK(order.size() == count * sizeof(int64_t), dir, "/data_order.bin holds ", order.size(),
                 " bytes, expected ", count * sizeof(int64_t), ": the checkpoint is damaged; ", older_advice(d));
    st.order.resize(count);
    std::memcpy(st.order.data(), order.data(), order.size());
  } catch (const json::exception& e) {
    STRATA_CHECK(false, dir, "/trainer_state.json is damaged (", e.what(), "); ", older_advice(d));
  }
  verify_data_position(d, st);

  SafetensorsFile f = SafetensorsFile::open((d / kStateFile).string());
  const ModelSpec& spec = store.spec();
  std::vector<float> buf;
  auto fetch = [&](const std::string& name, const TensorSpec& r) { state_fetch(f, dir, name, r, buf); };
  if (lora) {  // LoRA: the adapters' master and moments; the base stays as loaded from model.path
    lora_state_load(f, dir, *lora);
    return st;
  }
  // AdamW runs save master, exp_avg and exp_avg_sq per parameter; zo-sgd runs the master alone.
  // An AdamW checkpoint resumes a zo-sgd run (its moments are not read); not the other way.
  const bool saved_moments = !spec.params.rows().empty() && f.find("exp_avg/" + spec.params[0].name);
  const size_t arrays = saved_moments ? 3 : 1;
  STRATA_CHECK(f.entries().size() == arrays * spec.params.size(), dir, "/", kStateFile, " holds ", f.entries().size(),
               " tensors but the model has ", arrays * spec.params.size(), " (",
               saved_moments ? "master, exp_avg, exp_avg_sq" : "master", " per parameter): the checkpoint belongs to "
               "another model");
  STRATA_CHECK(saved_moments || !store.holds(StateArray::m), dir, " holds no AdamW moments (a zo-sgd run wrote it): "
               "resume it with optim.type = \"zo-sgd\", or start an AdamW run from its hf/ export (model.path = \"",
               (d / "hf").string(), "\")");
  note_moment_conversion(f, dir, store);
  for (size_t i = 0; i < spec.params.size(); ++i) {  // one tensor at a time into RAM or NVMe
    const TensorSpec& r = spec.params[i];
    fetch("master/" + r.name, r);
    store.set_param(i, buf.data());
    if (!store.holds(StateArray::m)) continue;
    state_fetch(f, dir, "exp_avg/" + r.name, r, buf, true);
    store.write_state(StateArray::m, i, 0, r.numel(), buf.data());
    state_fetch(f, dir, "exp_avg_sq/" + r.name, r, buf, true);
    store.write_state(StateArray::v, i, 0, r.numel(), buf.data());
  }
  return st;
}

}  // namespace strata
