"""A NumPy forward pass of Whisper from the CTranslate2 tensors: the export's yardstick.

Written independently of the ONNX graphs (the whole token sequence at once with a causal mask,
where the graph decodes one position at a time against its cache), it checks that the graphs
compute Whisper: the export compares the encoder's cross-attention keys and values and the
decoder's logits at every position with these, in float32.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

if TYPE_CHECKING:
    from collections.abc import Sequence

    from runtime.adapters.whisper_ct2 import Ct2Model, WhisperDims

__all__ = ["reference_cross_kv", "reference_logits"]

#: float32 keeps the reference fast (BLAS); it still differs from the graphs' float32 only by
#: the order of operations, far below what could change a token.
_DTYPE = np.float32


def _w(model: Ct2Model, name: str) -> np.ndarray:
    return model.get(name).astype(_DTYPE)


def _linear(x: np.ndarray, model: Ct2Model, prefix: str) -> np.ndarray:
    return np.asarray(x @ _w(model, f"{prefix}/weight").T + _w(model, f"{prefix}/bias"))


def _norm(x: np.ndarray, model: Ct2Model, prefix: str) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return np.asarray(
        (x - mean) / np.sqrt(var + 1e-5) * _w(model, f"{prefix}/gamma")
        + _w(model, f"{prefix}/beta")
    )


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to within 1.5e-7 (Abramowitz and Stegun 7.1.26), vectorized."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return np.asarray(sign * (1.0 - poly * np.exp(-a * a)))


def _gelu(x: np.ndarray) -> np.ndarray:
    return np.asarray(0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))))


def _conv(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """1-D convolution, kernel 3, padding 1: x [C_in, T] -> [C_out, T / stride]."""
    padded = np.pad(x, ((0, 0), (1, 1)))
    windows = sliding_window_view(padded, 3, axis=1)[:, ::stride]  # [C_in, T', 3]
    columns = windows.transpose(1, 0, 2).reshape(windows.shape[1], -1)  # [T', C_in * 3]
    return np.asarray((columns @ weight.reshape(weight.shape[0], -1).T).T + bias[:, None])


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    return x.reshape(x.shape[0], heads, -1).transpose(1, 0, 2)  # [H, T, D]


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + mask
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    context = weights @ v  # [H, T, D]
    return np.asarray(context.transpose(1, 0, 2).reshape(q.shape[1], -1))


def reference_cross_kv(model: Ct2Model, dims: WhisperDims, mel: np.ndarray) -> np.ndarray:
    """``mel`` [1, 80, F] -> every decoder layer's cross keys and values [L, 2, H, F / 2, D].

    ``F`` is the window's frames: Whisper's 3,000 (30 s), or fewer for a shorter window, whose
    encoder adds the first ``F / 2`` rows of the positional table (as the graph of a shorter
    window does); at most ``2 * dims.audio_positions``."""
    if mel.ndim != 3 or not 0 < mel.shape[2] <= 2 * dims.audio_positions:
        raise ValueError(
            f"mel of shape {list(mel.shape)}; accepted: [1, n_mels, frames], frames from 1 to "
            f"{2 * dims.audio_positions}"
        )
    x = _gelu(
        _conv(
            mel[0].astype(_DTYPE),
            _w(model, "encoder/conv1/weight"),
            _w(model, "encoder/conv1/bias"),
            1,
        )
    )
    x = _gelu(_conv(x, _w(model, "encoder/conv2/weight"), _w(model, "encoder/conv2/bias"), 2)).T
    x = x + _w(model, "encoder/position_encodings/encodings")[: x.shape[0]]
    width = dims.width
    for layer in range(dims.encoder_layers):
        prefix = f"encoder/layer_{layer}"
        qkv = _linear(
            _norm(x, model, f"{prefix}/self_attention/layer_norm"),
            model,
            f"{prefix}/self_attention/linear_0",
        )
        q, k, v = (_heads(qkv[:, i * width : (i + 1) * width], dims.heads) for i in range(3))
        x = x + _linear(_attention(q, k, v, None), model, f"{prefix}/self_attention/linear_1")
        hidden = _linear(
            _norm(x, model, f"{prefix}/ffn/layer_norm"), model, f"{prefix}/ffn/linear_0"
        )
        x = x + _linear(_gelu(hidden), model, f"{prefix}/ffn/linear_1")
    x = _norm(x, model, "encoder/layer_norm")
    out = []
    for layer in range(dims.decoder_layers):
        kv = _linear(x, model, f"decoder/layer_{layer}/attention/linear_1")
        out.append(np.stack([_heads(kv[:, :width], dims.heads), _heads(kv[:, width:], dims.heads)]))
    return np.stack(out)


def reference_logits(
    model: Ct2Model, dims: WhisperDims, tokens: Sequence[int], cross_kv: np.ndarray
) -> np.ndarray:
    """The decoder's logits [T, V] at every position of ``tokens`` (causal), given
    ``cross_kv`` [L, 2, H, A, D] (``A`` audio positions: 1,500 for a 30 s window, or the
    shorter window's)."""
    count = len(tokens)
    embedding = _w(model, "decoder/embeddings/weight")
    x = embedding[list(tokens)] + _w(model, "decoder/position_encodings/encodings")[:count]
    mask = np.triu(np.full((count, count), -np.inf, dtype=_DTYPE), k=1)
    width = dims.width
    cross = cross_kv.astype(_DTYPE)
    for layer in range(dims.decoder_layers):
        prefix = f"decoder/layer_{layer}"
        qkv = _linear(
            _norm(x, model, f"{prefix}/self_attention/layer_norm"),
            model,
            f"{prefix}/self_attention/linear_0",
        )
        q, k, v = (_heads(qkv[:, i * width : (i + 1) * width], dims.heads) for i in range(3))
        x = x + _linear(_attention(q, k, v, mask), model, f"{prefix}/self_attention/linear_1")
        q = _heads(
            _linear(
                _norm(x, model, f"{prefix}/attention/layer_norm"),
                model,
                f"{prefix}/attention/linear_0",
            ),
            dims.heads,
        )
        x = x + _linear(
            _attention(q, cross[layer, 0], cross[layer, 1], None),
            model,
            f"{prefix}/attention/linear_2",
        )
        hidden = _linear(
            _norm(x, model, f"{prefix}/ffn/layer_norm"), model, f"{prefix}/ffn/linear_0"
        )
        x = x + _linear(_gelu(hidden), model, f"{prefix}/ffn/linear_1")
    return np.asarray(_norm(x, model, "decoder/layer_norm") @ embedding.T)
