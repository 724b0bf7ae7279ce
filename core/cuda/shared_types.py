"""The element types of shared arrays NNFusion can declare (no imports: every DB read reaches this module)."""

from __future__ import annotations

# NNFusion's BlockFusion re-declares a row's shared arrays from `shared_memory` and sizes its one buffer by this table
# (BlockCudaEmitter::size_of_str_type, cuda_emitter.cpp): any other dtype makes the compiler CHECK-fail ("Unknown data
# type"), for every row with the BlockCudaEmitter tag, fused or not.
BLOCKFUSION_SHARED_DTYPES: dict[str, int] = {
    "char": 1, "float": 4, "double": 8, "int8_t": 1, "int16_t": 2, "int32_t": 4, "int64_t": 8,
    "uint8_t": 1, "uint16_t": 2, "uint32_t": 4, "uint64_t": 8}
# Shared arrays of a type outside the table, by its size: stored as the table's integer type of that size and read
# through a pointer of their own type (core/cuda/source.py). half is the one TVM's fp16 kernels declare.
SHARED_BITS_OF: dict[str, str] = {
    "half": "uint16_t", "__half": "uint16_t", "half2": "uint32_t", "__half2": "uint32_t", "int": "int32_t",
    "unsigned int": "uint32_t", "uint": "uint32_t", "short": "int16_t", "unsigned short": "uint16_t",
    "ushort": "uint16_t", "signed char": "int8_t", "unsigned char": "uint8_t", "uchar": "uint8_t",
    "long long": "int64_t", "unsigned long long": "uint64_t", "float2": "uint64_t", "int2": "uint64_t"}
