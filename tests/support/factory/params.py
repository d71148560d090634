"""Which tensors a Gemma 4 checkpoint holds: names, shapes, initialisers, quantization roles.

Names are produced in the google/HF layout (`model.language_model.*`, `model.vision_tower.*`,
`model.embed_vision.*`); `to_mlx_layout` maps them to the mlx-community layout
(`language_model.model.*`, `vision_tower.*`, `embed_vision.*`, MoE experts split into
`experts.switch_glu.{gate,up,down}_proj.weight`). Values are seeded by the HF name, so both
layouts of one seed hold the same numbers.

Initialisers keep random activations sane: linears ~ N(0, 1/in), embeddings ~ N(0, 1/hidden)
(times sqrt(hidden) at the input they are unit scale), norm weights near 1, layer_scalar in
[0.5, 1]. Roles say what a 4-bit conversion quantizes: "linear" and "embedding" at 4 bits,
"router" at 8 bits (as mlx-lm's gemma4 quant predicate does), None never.
"""

from __future__ import annotations

from dataclasses import dataclass

S, F = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Param:
    name: str  # name on disk
    shape: tuple[int, ...]
    init: tuple  # ("normal", std) | ("uniform", lo, hi) | ("permutation",)
    role: str | None = None  # "linear" | "embedding" | "router" | None
    source: str | None = None  # HF name that seeds the values (default: name)
    part: tuple[int, int] | None = None  # (index, count): one of `count` equal slices of the source along axis -2
    # axes order of the stored tensor over the source's (axis 0 stays first): MLX's conv layouts
    perm: tuple[int, ...] | None = None

    @property
    def seed_name(self) -> str:
        return self.source or self.name

    @property
    def source_shape(self) -> tuple[int, ...]:
        if self.perm is not None:
            return tuple(self.shape[self.perm.index(axis)] for axis in range(len(self.shape)))
        if self.part is None:
            return self.shape
        s = list(self.shape)
        s[-2] *= self.part[1]
        return tuple(s)


def _normal_in(in_dim: int) -> tuple:
    return ("normal", in_dim**-0.5)


_NORM = ("uniform", 0.85, 1.15)
_SCALAR = ("uniform", 0.5, 1.0)


def _linear(name: str, out_dim: int, in_dim: int, role: str | None = "linear") -> Param:
    return Param(f"{name}.weight", (out_dim, in_dim), _normal_in(in_dim), role)


def _norm(name: str, dim: int) -> Param:
    return Param(f"{name}.weight", (dim,), _NORM)


def _decoder_layer(
    p: str, cfg: dict, i: int, hidden: int, intermediate: int, has_kv: bool, query_only: bool = False
) -> list[Param]:
    """One Gemma 4 decoder layer under prefix `p` (target layer, or a query-only drafter layer)."""
    full = cfg["layer_types"][i] == F
    head_dim = cfg["global_head_dim"] if full else cfg["head_dim"]
    k_eq_v = cfg["attention_k_eq_v"] and full
    kv_heads = (
        cfg["num_global_key_value_heads"]
        if k_eq_v and cfg["num_global_key_value_heads"] is not None
        else cfg["num_key_value_heads"]
    )
    q_width = cfg["num_attention_heads"] * head_dim
    out = [
        _norm(f"{p}.input_layernorm", hidden),
        _norm(f"{p}.post_attention_layernorm", hidden),
        _norm(f"{p}.pre_feedforward_layernorm", hidden),
        _norm(f"{p}.post_feedforward_layernorm", hidden),
        Param(f"{p}.layer_scalar", (1,), _SCALAR),
        _linear(f"{p}.self_attn.q_proj", q_width, hidden),
        _linear(f"{p}.self_attn.o_proj", hidden, q_width),
        _norm(f"{p}.self_attn.q_norm", head_dim),
        _linear(f"{p}.mlp.gate_proj", intermediate, hidden),
        _linear(f"{p}.mlp.up_proj", intermediate, hidden),
        _linear(f"{p}.mlp.down_proj", hidden, intermediate),
    ]
    if has_kv and not query_only:
        out.append(_linear(f"{p}.self_attn.k_proj", kv_heads * head_dim, hidden))
        out.append(_norm(f"{p}.self_attn.k_norm", head_dim))
        if not k_eq_v:
            out.append(_linear(f"{p}.self_attn.v_proj", kv_heads * head_dim, hidden))
    return out


def target_text_params(cfg: dict) -> list[Param]:
    """The language model of a `gemma4` target, HF names."""
    p = "model.language_model"
    hidden, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    first_shared = n - cfg["num_kv_shared_layers"]
    ple = cfg["hidden_size_per_layer_input"]
    out = [
        Param(f"{p}.embed_tokens.weight", (cfg["vocab_size"], hidden), ("normal", hidden**-0.5), "embedding"),
        _norm(f"{p}.norm", hidden),
    ]
    if ple:
        out += [
            Param(
                f"{p}.embed_tokens_per_layer.weight",
                (cfg["vocab_size_per_layer_input"], n * ple),
                ("normal", ple**-0.5),
                "embedding",
            ),
            _linear(f"{p}.per_layer_model_projection", n * ple, hidden),
            _norm(f"{p}.per_layer_projection_norm", ple),
        ]
    for i in range(n):
        lp = f"{p}.layers.{i}"
        shared = i >= first_shared > 0
        width = cfg["intermediate_size"] * (2 if cfg["use_double_wide_mlp"] and shared else 1)
        out += _decoder_layer(lp, cfg, i, hidden, width, has_kv=not shared)
        if ple:
            out += [
                _linear(f"{lp}.per_layer_input_gate", ple, hidden),
                _linear(f"{lp}.per_layer_projection", hidden, ple),
                _norm(f"{lp}.post_per_layer_input_norm", hidden),
            ]
        if cfg["enable_moe_block"]:
            e, mi = cfg["num_experts"], cfg["moe_intermediate_size"]
            out += [
                _linear(f"{lp}.router.proj", e, hidden, role="router"),
                Param(f"{lp}.router.scale", (hidden,), _NORM),
                Param(f"{lp}.router.per_expert_scale", (e,), ("uniform", 0.5, 1.5)),
                Param(f"{lp}.experts.gate_up_proj", (e, 2 * mi, hidden), _normal_in(hidden), "linear"),
                Param(f"{lp}.experts.down_proj", (e, hidden, mi), _normal_in(mi), "linear"),
                _norm(f"{lp}.pre_feedforward_layernorm_2", hidden),
                _norm(f"{lp}.post_feedforward_layernorm_1", hidden),
                _norm(f"{lp}.post_feedforward_layernorm_2", hidden),
            ]
    return out


def vision_params(vcfg: dict, text_hidden: int) -> list[Param]:
    """The vision tower and `embed_vision`, HF names. Every linear sits in a clippable wrapper
    (`<proj>.linear.weight`); with `use_clipped_linears` each carries four scalar bounds."""
    p = "model.vision_tower"
    d, inter = vcfg["hidden_size"], vcfg["intermediate_size"]
    hd = vcfg["head_dim"]
    patch_in = 3 * vcfg["patch_size"] ** 2
    out = [
        Param(f"{p}.patch_embedder.input_proj.weight", (d, patch_in), _normal_in(patch_in)),
        Param(
            f"{p}.patch_embedder.position_embedding_table", (2, vcfg["position_embedding_size"], d), ("normal", 0.02)
        ),
    ]
    for i in range(vcfg["num_hidden_layers"]):
        lp = f"{p}.encoder.layers.{i}"
        out += [
            _norm(f"{lp}.{n}", d)
            for n in (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            )
        ]
        out += [_norm(f"{lp}.self_attn.q_norm", hd), _norm(f"{lp}.self_attn.k_norm", hd)]
        linears = {
            "self_attn.q_proj": (vcfg["num_attention_heads"] * hd, d),
            "self_attn.k_proj": (vcfg["num_key_value_heads"] * hd, d),
            "self_attn.v_proj": (vcfg["num_key_value_heads"] * hd, d),
            "self_attn.o_proj": (d, vcfg["num_attention_heads"] * hd),
            "mlp.gate_proj": (inter, d),
            "mlp.up_proj": (inter, d),
            "mlp.down_proj": (d, inter),
        }
        for name, (o, i_) in linears.items():
            out.append(Param(f"{lp}.{name}.linear.weight", (o, i_), _normal_in(i_)))
            if vcfg["use_clipped_linears"]:
                out += _clip_bounds(f"{lp}.{name}")
    if vcfg["standardize"]:
        out += [
            Param(f"{p}.std_bias", (d,), ("normal", 0.5)),
            Param(f"{p}.std_scale", (d,), ("uniform", 0.5, 1.5)),
        ]
    out.append(Param("model.embed_vision.embedding_projection.weight", (text_hidden, d), _normal_in(d)))
    return out


def unified_media_params(config: dict) -> list[Param]:
    """The 12B's encoder-free embedders, HF hub names: `vision_embedder` (LayerNorm over the 6912 raw
    values of a 48 x 48 patch, dense with bias, LayerNorm, factorized x/y position table, LayerNorm),
    then `embed_vision` and `embed_audio` (a bias-free projection each; their RMSNorms have no weight)."""
    v, a = config["vision_config"], config["audio_config"]
    text_hidden = config["text_config"]["hidden_size"]
    raw = 3 * v["model_patch_size"] ** 2
    d = v["mm_embed_dim"]
    p = "model.vision_embedder"
    out = [
        Param(f"{p}.patch_dense.weight", (d, raw), _normal_in(raw)),
        Param(f"{p}.patch_dense.bias", (d,), ("normal", 0.1)),
        Param(f"{p}.pos_embedding", (v["mm_posemb_size"], 2, d), ("normal", 1.0)),
    ]
    for name, dim in (("patch_ln1", raw), ("patch_ln2", d), ("pos_norm", d)):
        out += [Param(f"{p}.{name}.weight", (dim,), _NORM), Param(f"{p}.{name}.bias", (dim,), ("normal", 0.1))]
    out.append(
        Param("model.embed_vision.embedding_projection.weight", (text_hidden, v["output_proj_dims"]), _normal_in(d))
    )
    audio_in = a["output_proj_dims"]
    out.append(Param("model.embed_audio.embedding_projection.weight", (text_hidden, audio_in), _normal_in(audio_in)))
    return out


def _clip_bounds(name: str) -> list[Param]:
    # Finite, asymmetric bounds, wide enough that only the tails get clipped.
    return [
        Param(f"{name}.input_min", (), ("uniform", -4.0, -2.0)),
        Param(f"{name}.input_max", (), ("uniform", 2.0, 4.0)),
        Param(f"{name}.output_min", (), ("uniform", -4.0, -2.0)),
        Param(f"{name}.output_max", (), ("uniform", 2.0, 4.0)),
    ]


def audio_params(acfg: dict, text_hidden: int) -> list[Param]:
    """The E2B/E4B conformer audio tower and `embed_audio`, HF names (convolutions [O, I, kH, kW] and
    [C, 1, K]). The tower stays unquantized in a 4-bit conversion; `embed_audio`'s projection does not."""
    p = "model.audio_tower"
    d, (c0, c1), k = acfg["hidden_size"], acfg["subsampling_conv_channels"], acfg["conv_kernel_size"]
    hd = d // acfg["num_attention_heads"]
    clip = acfg["use_clipped_linears"]
    sscp = f"{p}.subsample_conv_projection"
    out = [
        Param(f"{sscp}.layer0.conv.weight", (c0, 1, 3, 3), _normal_in(9)),
        _norm(f"{sscp}.layer0.norm", c0),
        Param(f"{sscp}.layer1.conv.weight", (c1, c0, 3, 3), _normal_in(9 * c0)),
        _norm(f"{sscp}.layer1.norm", c1),
        Param(f"{sscp}.input_proj_linear.weight", (d, 32 * c1), _normal_in(32 * c1)),  # 128 mel bins / 4
    ]

    def clipped(name: str, o: int, i: int) -> list[Param]:
        return [Param(f"{name}.linear.weight", (o, i), _normal_in(i))] + (_clip_bounds(name) if clip else [])

    for n in range(acfg["num_hidden_layers"]):
        lp = f"{p}.layers.{n}"
        for ff in ("feed_forward1", "feed_forward2"):
            out += [_norm(f"{lp}.{ff}.pre_layer_norm", d), _norm(f"{lp}.{ff}.post_layer_norm", d)]
            out += clipped(f"{lp}.{ff}.ffw_layer_1", 4 * d, d) + clipped(f"{lp}.{ff}.ffw_layer_2", d, 4 * d)
        out += [_norm(f"{lp}.{name}", d) for name in ("norm_pre_attn", "norm_post_attn", "norm_out")]
        for name in ("q_proj", "k_proj", "v_proj", "post"):
            out += clipped(f"{lp}.self_attn.{name}", d, d)
        out += [
            Param(f"{lp}.self_attn.relative_k_proj.weight", (d, d), _normal_in(d)),
            Param(f"{lp}.self_attn.per_dim_scale", (hd,), ("uniform", 0.5, 1.5)),
            _norm(f"{lp}.lconv1d.pre_layer_norm", d),
            _norm(f"{lp}.lconv1d.conv_norm", d),
            Param(f"{lp}.lconv1d.depthwise_conv1d.weight", (d, 1, k), _normal_in(k)),
        ]
        out += clipped(f"{lp}.lconv1d.linear_start", 2 * d, d) + clipped(f"{lp}.lconv1d.linear_end", d, d)
    o = acfg["output_proj_dims"]
    out += [
        Param(f"{p}.output_proj.weight", (o, d), _normal_in(d)),
        Param(f"{p}.output_proj.bias", (o,), ("normal", 0.1)),
        Param("model.embed_audio.embedding_projection.weight", (text_hidden, o), _normal_in(o), "linear"),
    ]
    return out


def target_params(config: dict) -> list[Param]:
    text = config["text_config"]
    if config.get("model_type") == "gemma4_unified":
        return target_text_params(text) + unified_media_params(config)
    out = target_text_params(text) + vision_params(config["vision_config"], text["hidden_size"])
    if config.get("audio_config"):
        out += audio_params(config["audio_config"], text["hidden_size"])
    return out


def drafter_params(config: dict) -> list[Param]:
    """A `gemma4_assistant` (or `gemma4_unified_assistant`) drafter, HF names (the only layout drafters ship in)."""
    cfg = config["text_config"]
    hidden, backbone = cfg["hidden_size"], config["backbone_hidden_size"]
    out = [
        Param("model.embed_tokens.weight", (cfg["vocab_size"], hidden), ("normal", hidden**-0.5)),
        _norm("model.norm", hidden),
        _linear("pre_projection", hidden, 2 * backbone, role=None),
        _linear("post_projection", backbone, hidden, role=None),
    ]
    for i in range(cfg["num_hidden_layers"]):
        out += _decoder_layer(
            f"model.layers.{i}", cfg, i, hidden, cfg["intermediate_size"], has_kv=False, query_only=True
        )
    if config["use_ordered_embeddings"]:
        out += [
            Param("masked_embedding.centroids.weight", (config["num_centroids"], hidden), _normal_in(hidden)),
            Param("masked_embedding.token_ordering", (cfg["vocab_size"],), ("permutation",)),
        ]
    return [p if p.role is None else Param(p.name, p.shape, p.init, None) for p in out]


def mlx_name(hf_name: str) -> str:
    """The mlx-community name of an HF target tensor (without the MoE split)."""
    for old, new in (
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.embed_vision.", "embed_vision."),
        ("model.vision_embedder.", "vision_embedder."),  # the 12B's encoder-free embedders
        ("model.audio_tower.", "audio_tower."),
        ("model.embed_audio.", "embed_audio."),
    ):
        if hf_name.startswith(old):
            return new + hf_name[len(old) :]
    raise ValueError(f"not a Gemma 4 target tensor name: {hf_name}")


def hf_to_mlx_names(hf_name: str) -> list[str]:
    """mlx-community names holding the values of one HF tensor (two for the fused expert gate/up)."""
    base = mlx_name(hf_name)
    if base.endswith(".experts.gate_up_proj"):
        stem = base[: -len("gate_up_proj")]
        return [f"{stem}switch_glu.gate_proj.weight", f"{stem}switch_glu.up_proj.weight"]
    if base.endswith(".experts.down_proj"):
        return [base[: -len("down_proj")] + "switch_glu.down_proj.weight"]
    return [base]


# mlx-community stores convolutions channels-last: conv2d [O, I, kH, kW] -> [O, kH, kW, I], [C, 1, K] -> [C, K, 1]
_MLX_CONV_PERMS = {4: (0, 2, 3, 1), 3: (0, 2, 1)}


def to_mlx_layout(params: list[Param]) -> list[Param]:
    out = []
    for p in params:
        names = hf_to_mlx_names(p.name)
        if len(names) == 1:
            conv = p.name.endswith((".conv.weight", ".depthwise_conv1d.weight"))
            if p.name.startswith("model.audio_tower.") and conv:
                perm = _MLX_CONV_PERMS[len(p.shape)]
                stored = tuple(p.shape[a] for a in perm)
                out.append(Param(names[0], stored, p.init, p.role, source=p.name, perm=perm))
            else:
                out.append(Param(names[0], p.shape, p.init, p.role, source=p.name))
            continue
        shape = list(p.shape)
        shape[-2] //= len(names)
        for k, name in enumerate(names):
            out.append(Param(name, tuple(shape), p.init, p.role, source=p.name, part=(k, len(names))))
    return out
