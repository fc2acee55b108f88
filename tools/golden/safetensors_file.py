"""The safetensors layout the golden scripts write: an 8-byte little-endian header length, the
JSON header (compact, space-padded to a multiple of 8 bytes), then the tensors' bytes in header
order."""
import json
import struct


def safetensors_write_blobs(path, tensors, metadata=None):
    """tensors: (name, dtype name, shape, little-endian bytes), written in name order; metadata,
    when given, becomes the header's __metadata__. Returns the bytes of tensor data written."""
    header = {} if metadata is None else {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, dtype, shape, data in sorted(tensors, key=lambda t: t[0]):
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    return offset
