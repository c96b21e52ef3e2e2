"""Gradient compression, as horovod.torch.Compression: a tensor is compressed before it goes on
the wire and decompressed after, so Compression.fp16 (or .bf16) sends float32/float64 gradients at
2 bytes an element.

    compressed, ctx = Compression.fp16.compress(grad)    # float16 for floating-point tensors
    reduced = trainrun.allreduce(compressed)
    grad = Compression.fp16.decompress(reduced, ctx)     # back to grad's dtype
"""

import torch


class Compressor:
    """Compresses a tensor for the wire and restores it afterwards."""

    @staticmethod
    def compress(tensor):
        """Returns (compressed tensor, context for decompress)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


def _cast_compressor(wire_dtype):

    class _Cast(Compressor):

        @staticmethod
        def compress(tensor):
            if tensor.dtype.is_floating_point and tensor.dtype != wire_dtype:
                return tensor.type(wire_dtype), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor if ctx is None else tensor.type(ctx)

    return _Cast


FP16Compressor = _cast_compressor(torch.float16)
FP16Compressor.__name__ = "FP16Compressor"
FP16Compressor.__doc__ = "Sends floating-point tensors as IEEE float16 (half the bytes of float32)."
BF16Compressor = _cast_compressor(torch.bfloat16)
BF16Compressor.__name__ = "BF16Compressor"
BF16Compressor.__doc__ = "Sends floating-point tensors as bfloat16 (float32's range, half its bytes)."


class Compression:
    """The compressors: none (default), fp16, bf16."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
