"""Whisper's encoder and one-step decoder as ONNX graphs, built node by node from NumPy weights.

No exporter is involved: the graphs are written with ``onnx.helper`` from the tensors
:mod:`runtime.adapters.whisper_ct2` reads, in float32 (opset 17). I/O (``L`` decoder layers,
``H`` heads, ``D`` head size, ``V`` vocabulary)::

    encoder  mel float32[1, 80, 3000]
             -> cross_k_<l> float32[H, D, 1500]        each decoder layer's cross-attention
                cross_v_<l> float32[H, 1500, D]        keys (transposed) and values, once
    decoder  tokens int64[1, 1]                        the token at position S - 1
             self_kv float32[S, L, 2, H, D]            keys and values of positions 0 .. S - 2;
                                                       the last row is a placeholder
             cross_k_<l>, cross_v_<l>                  as the encoder gave them
             -> logits float32[1, V]                   the next token's scores
                new_kv float32[1, L, 2, H, D]          position S - 1's keys and values

Those are the shapes of Whisper's 30 s window. A shorter window (``build_encoder(frames=F)``,
``build_decoder(audio_positions=F / 2)``; the export writes a 10 s pair too) takes
``mel [1, 80, F]``, adds the first ``F / 2`` rows of the encoder's positional table, and gives
cross keys and values over ``F / 2`` positions: the encoder's cost falls about in proportion.

The decoder reads its position from ``self_kv``'s length, so one graph serves every step
(``S`` from 1 to the model's 448 text positions); the caller writes ``new_kv`` into row
``S - 1`` of its cache. Keeping the cache position-major makes each step's input one
contiguous slice of that cache, and giving each layer's cross keys and values as inputs of
their own lets the decoder read them in place (slicing one tensor per step would copy all of
them: a third of a step's time). The token embedding is one initializer, used both to look
tokens up (Gather) and as the tied output projection (Gemm with ``transB``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runtime.adapters.whisper_decode import cross_names

if TYPE_CHECKING:
    from collections.abc import Sequence

    from runtime.adapters.whisper_ct2 import Ct2Model, WhisperDims

__all__ = ["OPSET", "build_decoder", "build_encoder", "cross_names"]

OPSET: Final = 17
_F32: Final = TensorProto.FLOAT
_I64: Final = TensorProto.INT64
_LN_EPSILON: Final = 1e-5


class _Graph:
    """Nodes and initializers of one graph under construction, with unique names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, hint: str, array: np.ndarray) -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def ints(self, hint: str, values: list[int]) -> str:
        return self.const(hint, np.array(values, dtype=np.int64))

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, **attrs: Any) -> str:
        out = self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def ops(self, op_type: str, inputs: list[str], count: int, **attrs: Any) -> list[str]:
        outs = [self.name(op_type.lower()) for _ in range(count)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0], **attrs))
        return outs

    # -- layers --------------------------------------------------------------------------

    def linear(self, x: str, weight: np.ndarray, bias: np.ndarray | None, hint: str) -> str:
        """``x @ weight.T + bias`` (CTranslate2 weights are [out, in])."""
        w = self.const(f"{hint}_w", weight.T.astype(np.float32))
        y = self.op("MatMul", [x, w], hint)
        if bias is None or not np.any(bias):
            return y
        return self.op("Add", [y, self.const(f"{hint}_b", bias.astype(np.float32))], hint)

    def layer_norm(self, x: str, model: Ct2Model, prefix: str) -> str:
        gamma = self.const(f"{prefix}_g", model.get(f"{prefix}/gamma"))
        beta = self.const(f"{prefix}_b", model.get(f"{prefix}/beta"))
        return self.op("LayerNormalization", [x, gamma, beta], "ln", axis=-1, epsilon=_LN_EPSILON)

    def gelu(self, x: str) -> str:
        """Exact GELU, ``0.5 x (1 + erf(x / sqrt 2))`` (ONNX Runtime fuses the pattern)."""
        scaled = self.op("Div", [x, self.const("sqrt2", np.array(math.sqrt(2.0), np.float32))])
        erf = self.op("Erf", [scaled])
        one = self.op("Add", [erf, self.const("one", np.array(1.0, np.float32))])
        half = self.op("Mul", [x, self.const("half", np.array(0.5, np.float32))])
        return self.op("Mul", [half, one], "gelu")

    def ffn(self, x: str, model: Ct2Model, prefix: str) -> str:
        normed = self.layer_norm(x, model, f"{prefix}/layer_norm")
        hidden = self.linear(
            normed,
            model.get(f"{prefix}/linear_0/weight"),
            model.get(f"{prefix}/linear_0/bias"),
            "fc1",
        )
        out = self.linear(
            self.gelu(hidden),
            model.get(f"{prefix}/linear_1/weight"),
            model.get(f"{prefix}/linear_1/bias"),
            "fc2",
        )
        return self.op("Add", [x, out], "residual")

    def attend(self, q: str, k_t: str, v: str, scale: float) -> str:
        """softmax((q * scale) @ k_t) @ v over the last axis."""
        scaled = self.op("Mul", [q, self.const("scale", np.array(scale, np.float32))])
        scores = self.op("MatMul", [scaled, k_t], "scores")
        weights = self.op("Softmax", [scores], "weights", axis=-1)
        return self.op("MatMul", [weights, v], "context")


def _tensor(name: str, elem: int, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(
    graph: _Graph, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]
) -> onnx.ModelProto:
    body = helper.make_graph(graph.nodes, name, inputs, outputs, graph.initializers)
    model = helper.make_model(
        body, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="omni-edge-studio"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def build_encoder(model: Ct2Model, dims: WhisperDims, frames: int = 3000) -> onnx.ModelProto:
    """The encoder graph (see the module): log-mel in, the decoder's cross keys/values out.
    ``frames``: the window's log-mel frames, even, at most twice the audio positions (3,000)."""
    if frames <= 0 or frames % 2 or frames // 2 > dims.audio_positions:
        raise ValueError(
            f"a window of {frames} frames; accepted: an even number from 2 to "
            f"{2 * dims.audio_positions}"
        )
    g = _Graph()
    heads, head_dim, width = dims.heads, dims.head_dim, dims.width
    positions = frames // 2
    conv1 = g.op(
        "Conv",
        [
            "mel",
            g.const("conv1_w", model.get("encoder/conv1/weight")),
            g.const("conv1_b", model.get("encoder/conv1/bias")),
        ],
        "conv1",
        kernel_shape=[3],
        pads=[1, 1],
    )
    conv2 = g.op(
        "Conv",
        [
            g.gelu(conv1),
            g.const("conv2_w", model.get("encoder/conv2/weight")),
            g.const("conv2_b", model.get("encoder/conv2/bias")),
        ],
        "conv2",
        kernel_shape=[3],
        pads=[1, 1],
        strides=[2],
    )
    x = g.op("Transpose", [g.gelu(conv2)], "frames", perm=[0, 2, 1])  # [1, T, C]
    pos = model.get("encoder/position_encodings/encodings")[:positions]
    x = g.op("Add", [x, g.const("enc_pos", pos)], "embedded")
    scale = 1.0 / math.sqrt(head_dim)
    split_heads = g.ints("split_heads", [1, positions, heads, head_dim])
    merge_heads = g.ints("merge_heads", [1, positions, width])
    for layer in range(dims.encoder_layers):
        prefix = f"encoder/layer_{layer}/self_attention"
        normed = g.layer_norm(x, model, f"{prefix}/layer_norm")
        qkv = g.linear(
            normed,
            model.get(f"{prefix}/linear_0/weight"),
            model.get(f"{prefix}/linear_0/bias"),
            "qkv",
        )
        q, k, v = g.ops("Split", [qkv, g.ints("thirds", [width] * 3)], 3, axis=-1)
        q = g.op("Transpose", [g.op("Reshape", [q, split_heads])], "q", perm=[0, 2, 1, 3])
        k_t = g.op("Transpose", [g.op("Reshape", [k, split_heads])], "k_t", perm=[0, 2, 3, 1])
        v = g.op("Transpose", [g.op("Reshape", [v, split_heads])], "v", perm=[0, 2, 1, 3])
        context = g.op("Transpose", [g.attend(q, k_t, v, scale)], perm=[0, 2, 1, 3])
        out = g.linear(
            g.op("Reshape", [context, merge_heads]),
            model.get(f"{prefix}/linear_1/weight"),
            model.get(f"{prefix}/linear_1/bias"),
            "attn_out",
        )
        x = g.op("Add", [x, out], "residual")
        x = g.ffn(x, model, f"encoder/layer_{layer}/ffn")
    hidden = g.layer_norm(x, model, "encoder/layer_norm")
    # Every decoder layer's cross-attention keys [H, D, T] (transposed for the scores) and
    # values [H, T, D], each its own output, so the decoder reads them without a copy.
    outputs = []
    kv_heads = g.ints("kv_heads", [positions, 2, heads, head_dim])
    for layer in range(dims.decoder_layers):
        prefix = f"decoder/layer_{layer}/attention/linear_1"
        kv = g.linear(
            hidden, model.get(f"{prefix}/weight"), model.get(f"{prefix}/bias"), "cross_kv"
        )
        kv = g.op("Reshape", [kv, kv_heads])  # [T, 2, H, D]
        keys, values = g.ops("Split", [kv, g.ints("halves", [1, 1])], 2, axis=1)
        keys = g.op("Reshape", [keys, g.ints("per_head", [positions, heads, head_dim])])
        values = g.op("Reshape", [values, g.ints("per_head", [positions, heads, head_dim])])
        key_name, value_name = cross_names(layer)
        g.nodes.append(helper.make_node("Transpose", [keys], [key_name], perm=[1, 2, 0]))
        g.nodes.append(helper.make_node("Transpose", [values], [value_name], perm=[1, 0, 2]))
        outputs += [
            _tensor(key_name, _F32, [heads, head_dim, positions]),
            _tensor(value_name, _F32, [heads, positions, head_dim]),
        ]
    return _model(g, "whisper_encoder", [_tensor("mel", _F32, [1, dims.n_mels, frames])], outputs)


def build_decoder(
    model: Ct2Model, dims: WhisperDims, audio_positions: int = 1500
) -> onnx.ModelProto:
    """The one-step decoder graph (see the module)."""
    g = _Graph()
    heads, head_dim, width, layers = dims.heads, dims.head_dim, dims.width, dims.decoder_layers
    embedding = g.const("embedding", model.get("decoder/embeddings/weight"))  # [V, C], tied
    # The position of this step: the cache's length less one.
    length = g.op("Gather", [g.op("Shape", ["self_kv"]), g.ints("zero", [0])], "length")
    position = g.op("Sub", [length, g.ints("one", [1])], "position")
    pos_table = g.const("dec_pos", model.get("decoder/position_encodings/encodings"))
    token = g.op("Gather", [embedding, g.op("Reshape", ["tokens", g.ints("flat", [1])])], "token")
    x = g.op("Add", [token, g.op("Gather", [pos_table, position], "pos")], "embedded")  # [1, C]
    scale = 1.0 / math.sqrt(head_dim)
    one_head = g.ints("one_head", [heads, 1, head_dim])
    one_row = g.ints("one_row", [1, width])
    row_kv = g.ints("row_kv", [1, 1, heads, head_dim])
    past_end = g.ints("past_end", [-1])
    new_rows = []
    for layer in range(layers):
        prefix = f"decoder/layer_{layer}"
        # Self-attention over the cache and this position.
        normed = g.layer_norm(x, model, f"{prefix}/self_attention/layer_norm")
        qkv = g.linear(
            normed,
            model.get(f"{prefix}/self_attention/linear_0/weight"),
            model.get(f"{prefix}/self_attention/linear_0/bias"),
            "qkv",
        )
        q, k, v = g.ops("Split", [qkv, g.ints("thirds", [width] * 3)], 3, axis=-1)
        cache = g.op(
            "Gather", ["self_kv", g.ints("layer", [layer])], "cache", axis=1
        )  # [S,1,2,H,D]
        sides = []
        for side, new in ((0, k), (1, v)):
            past = g.op("Gather", [cache, g.ints("side", [side])], "past", axis=2)  # [S,1,1,H,D]
            past = g.op("Reshape", [past, g.ints("past_rows", [-1, heads, head_dim])])  # [S,H,D]
            past = g.op("Slice", [past, g.ints("zero", [0]), past_end, g.ints("axis0", [0])])
            row = g.op("Reshape", [new, g.ints("new_row", [1, heads, head_dim])])  # [1,H,D]
            full = g.op("Concat", [past, row], "full", axis=0)  # [S,H,D]
            sides.append((row, full))
        (k_row, k_full), (v_row, v_full) = sides
        q_h = g.op(
            "Transpose",
            [g.op("Reshape", [q, g.ints("q_rows", [1, heads, head_dim])])],
            perm=[1, 0, 2],
        )
        k_t = g.op("Transpose", [k_full], "k_t", perm=[1, 2, 0])  # [H,D,S]
        v_h = g.op("Transpose", [v_full], "v", perm=[1, 0, 2])  # [H,S,D]
        context = g.attend(q_h, k_t, v_h, scale)  # [H,1,D]
        context = g.op("Reshape", [g.op("Transpose", [context], perm=[1, 0, 2]), one_row])
        out = g.linear(
            context,
            model.get(f"{prefix}/self_attention/linear_1/weight"),
            model.get(f"{prefix}/self_attention/linear_1/bias"),
            "self_out",
        )
        x = g.op("Add", [x, out], "residual")
        new_rows.append(
            g.op(
                "Concat",
                [g.op("Reshape", [k_row, row_kv]), g.op("Reshape", [v_row, row_kv])],
                "new_row",
                axis=1,
            )
        )  # [1,2,H,D]
        # Cross-attention over the encoder's keys and values.
        normed = g.layer_norm(x, model, f"{prefix}/attention/layer_norm")
        q = g.linear(
            normed,
            model.get(f"{prefix}/attention/linear_0/weight"),
            model.get(f"{prefix}/attention/linear_0/bias"),
            "cross_q",
        )
        q_h = g.op("Reshape", [q, one_head])  # [H,1,D]
        k_t, values = cross_names(layer)  # [H,D,T] and [H,T,D], graph inputs
        context = g.attend(q_h, k_t, values, scale)  # [H,1,D]
        context = g.op("Reshape", [g.op("Transpose", [context], perm=[1, 0, 2]), one_row])
        out = g.linear(
            context,
            model.get(f"{prefix}/attention/linear_2/weight"),
            model.get(f"{prefix}/attention/linear_2/bias"),
            "cross_out",
        )
        x = g.op("Add", [x, out], "residual")
        x = g.ffn(x, model, f"{prefix}/ffn")
    hidden = g.layer_norm(x, model, "decoder/layer_norm")
    g.nodes.append(
        helper.make_node("Gemm", [hidden, embedding], ["logits"], name="logits", transB=1)
    )
    stacked = g.op("Concat", new_rows, "stacked", axis=0)  # [L,2,H,D]
    g.nodes.append(
        helper.make_node(
            "Reshape",
            [stacked, g.ints("new_kv_shape", [1, layers, 2, heads, head_dim])],
            ["new_kv"],
            name="new_kv",
        )
    )
    return _model(
        g,
        "whisper_decoder_step",
        [
            _tensor("tokens", _I64, [1, 1]),
            _tensor("self_kv", _F32, ["positions", layers, 2, heads, head_dim]),
            *(
                _tensor(name, _F32, shape)
                for layer in range(layers)
                for name, shape in zip(
                    cross_names(layer),
                    ([heads, head_dim, audio_positions], [heads, audio_positions, head_dim]),
                    strict=True,
                )
            ),
        ],
        [
            _tensor("logits", _F32, [1, dims.vocab]),
            _tensor("new_kv", _F32, [1, layers, 2, heads, head_dim]),
        ],
    )
