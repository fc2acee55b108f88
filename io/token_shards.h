// Binary token shards: what `strata prepare` writes to data.prepared_dir so training reads
// samples instead of tokenizing again. One shard file per split (train.bin, eval.bin, and for
// preference data train.rejected.bin / eval.rejected.bin) plus manifest.json, which holds a
// fingerprint of everything that produced them (data files' size and mtime, data.* settings,
// the tokenizer.json and chat template contents). Files are written to a temporary name,
// fsynced and renamed; the manifest last, so a manifest means a complete set.
//
// Shard layout, little-endian, read through mmap:
//   0   char[8] magic "STRATASH"      8  u32 version (2)        12 u32 token_bytes (2 or 4)
//   16  u64 vocab_size (ids are below it; token_bytes = 2 when it is <= 65536)
//   24  u64 sample_count              32 u64 token_count
//   40  u64 tokens_offset (128)       48 u64 labels_offset      56 u64 offsets_offset
//   64  u64 fingerprint hash (the manifest's; ties the shard to it)
//   72  u32 flags (bit 0: pretraining samples, which packing may split across rows)
//   76  zero up to 128
//   tokens   token_count ids (u16 or u32)
//   labels   token_count bytes, 0 or 1 (1: the token is trained on)
//   offsets  sample_count + 1 u64 token offsets (first 0, ascending, last token_count), 8-aligned
//   crc      u32 CRC-32C (io/checksum.h) of every byte before it
// Reading revalidates all of it: magic, version, sizes against the file size, the checksum (one
// pass over the mapping), offsets, ids and labels. A corrupt or stale shard, or one of another
// format version (version 1 had no checksum; manifest.json's "strata_prepared" is the set's
// version, 2), is an error (exit 2) naming the file and saying to rerun `strata prepare`; failing
// to read one is an I/O error (exit 4).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/datasets.h"
#include "io/json.h"

namespace strata {

// One shard file. vocab_size bounds the ids; fingerprint_hash is checked on reading.
void shard_write(const std::string& path, const std::vector<Sample>& samples, int64_t vocab_size,
                 uint64_t fingerprint_hash);
// Reads and validates a shard; its ids must also be below max_vocab_size (the model's).
std::vector<Sample> shard_read(const std::string& path, int64_t max_vocab_size, uint64_t fingerprint_hash);

// What produced a run's samples: compared with the manifest's on every load.
nlohmann::json prepared_fingerprint(const SamplesOptions& options, const TextEncoder& encoder);
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

// True when dir holds a manifest.json.
bool prepared_exists(const std::string& dir);
// Writes the shards and the manifest (after removing an old manifest). vocab_size: the encoder's.
void prepared_write(const std::string& dir, const TrainingSamples& s, const nlohmann::json& fingerprint,
                    int64_t vocab_size);
// Reads a prepared dir for these options: the fingerprint must match and every shard validate.
TrainingSamples prepared_read(const std::string& dir, const SamplesOptions& options, const TextEncoder& encoder,
                              int64_t model_vocab_size);

}  // namespace strata
