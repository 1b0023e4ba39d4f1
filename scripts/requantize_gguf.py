#!/usr/bin/env python3
"""Rewrites a GGUF model with its quantised matrices in another block type or a float type.

    python3 scripts/requantize_gguf.py IN.gguf OUT.gguf [--type Q8_0] [--tensors REGEX]

Every tensor of a block-quantised type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) is dequantised and
quantised again to --type with gguf-py (gguf.quants, numpy: ggml's reference quantisers), or
stored as F32 / F16 / BF16 values (--type F32|F16|BF16: the dequantised values, rounded for F16
and BF16); float tensors (norms) and all metadata (tokenizer, chat template, hyper-parameters)
are copied as they are. `--tensors REGEX` converts only the block-quantised tensors whose name
it matches (re.search; e.g. 'token_embd' for a draft's embedding and output layer alone). Used to benchmark the CPU kernels of one model in several weight types (README, "Measured":
SmolLM2-135M-Instruct Q4_1 -> Q8_0); the result carries the rounding of both quantisations, so it
is a benchmark input, not a better model.

Needs the `gguf` and `numpy` packages (pip install gguf numpy, in a venv). Exit status 0 on
success, 1 with a message on an unreadable input or an unsupported --type.
"""
import argparse
import re
import sys

import gguf
import numpy as np
from gguf.quants import dequantize, quantize

BLOCK_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}
FLOAT_TYPES = {"F32", "F16", "BF16"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--type", default="Q8_0",
                    help="target type: " + ", ".join(sorted(BLOCK_TYPES | FLOAT_TYPES)))
    ap.add_argument("--tensors", default=None,
                    help="convert only the tensors whose name matches this regular expression")
    args = ap.parse_args()
    if args.type not in BLOCK_TYPES | FLOAT_TYPES:
        print(f"requantize_gguf: unsupported --type {args.type}", file=sys.stderr)
        return 1
    target = gguf.GGMLQuantizationType[args.type]
    try:
        reader = gguf.GGUFReader(args.input)
    except (OSError, ValueError) as e:
        print(f"requantize_gguf: cannot read {args.input}: {e}", file=sys.stderr)
        return 1

    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(args.output, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)

    converted = 0
    for t in reader.tensors:
        qtype = gguf.GGMLQuantizationType(t.tensor_type)
        wanted = args.tensors is None or re.search(args.tensors, t.name)
        if qtype.name in BLOCK_TYPES and qtype != target and wanted:
            data = quantize(dequantize(t.data, qtype).astype(np.float32), target)
            writer.add_tensor(t.name, data, raw_dtype=target)
            converted += 1
        else:
            writer.add_tensor(t.name, t.data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"requantize_gguf: {converted} tensors -> {args.type}, "
          f"{len(reader.tensors)} in all: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
