"""The feature drafter (EAGLE-1 family): one decoder layer that predicts the base model's next
final hidden state ("feature") from the current one and the next token, unrolled on its own
predictions to draft several tokens ahead.

    row t:   x_t = [f_t ; E(x_{t+1})] W_fc                  f_t  the base's final hidden state at t  [h]
             g_t = norm(layer(x_≤t))                         (causal self-attention over the rows, its own KV)
             logits_t = g_t @ lm_head_t[:, token_map]        guesses token t + 2, over N sub-vocabulary ids
    g_t is trained to equal f_{t+1}; drafting feeds it back as the next row's f.

`layer` is a Llama decoder layer of the base model's sizes (GQA, rotary at position t + 1, the
position of the token it embeds); E is the base model's embedding table and lm_head_t its LM head,
both frozen and not part of the drafter's state. Two forwards over the same weights:
  forward        – training: B sequences of S rows, causal, plain torch (autograd);
  step           – the exported graph: W rows on top of a fixed KV buffer through the same
                   GroupQueryAttention op as the decoder (export/attention.py), with an additive
                   bias for tree attention; tests hold the two equal.

Files (a drafter folder): `drafter.safetensors` (fc, layer, norm, token_map) and `drafter.json`
(FeatureDrafterSpec). Nothing is pickled.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specmemo.errors import SpecMemoError
from specmemo.export import attention  # noqa: F401  (registers torch.ops.specmemo.group_query_attention)
from specmemo.export.attention import apply_rotary

DRAFTER_FILE = "drafter.safetensors"
DRAFTER_SPEC_FILE = "drafter.json"
DRAFTER_FORMAT = 1


class DrafterError(SpecMemoError, ValueError):
    """Feature-drafter weights missing, malformed, or made for another base model."""


@dataclass(frozen=True)
class FeatureDrafterSpec:
    hidden_size: int  # h
    vocab_size: int  # V
    num_heads: int  # H of the drafter's attention (the base model's)
    num_kv_heads: int  # H_kv
    head_dim: int  # D
    intermediate_size: int
    rms_norm_eps: float
    subvocab_size: int  # N
    base_sha256: str = ""
    card: dict = field(default_factory=dict)
    format: int = DRAFTER_FORMAT

    def __post_init__(self) -> None:
        for name in ("hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            if getattr(self, name) < 1:
                raise DrafterError(f"drafter.{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.subvocab_size <= self.vocab_size:
            raise DrafterError(f"drafter.subvocab_size must be in 1..{self.vocab_size}, got {self.subvocab_size}")
        if self.format != DRAFTER_FORMAT:
            raise DrafterError(f"drafter format {self.format} is not {DRAFTER_FORMAT}: retrain the drafter")

    @classmethod
    def for_base(cls, dims, *, subvocab_size: int, base_sha256: str = "",
                 intermediate_size: int | None = None) -> FeatureDrafterSpec:
        """The sizes of one layer of the base model (dims: runtime.manifest.ModelDims), its MLP
        `intermediate_size` wide if given (a narrow MLP: a cheaper drafted depth)."""
        return cls(hidden_size=dims.hidden_size, vocab_size=dims.vocab_size, num_heads=dims.num_heads,
                   num_kv_heads=dims.num_kv_heads, head_dim=dims.head_dim,
                   intermediate_size=intermediate_size or dims.intermediate_size,
                   rms_norm_eps=dims.rms_norm_eps, subvocab_size=min(subvocab_size, dims.vocab_size),
                   base_sha256=base_sha256)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str, where: str) -> FeatureDrafterSpec:
        try:
            return cls(**json.loads(text))
        except DrafterError:
            raise
        except (json.JSONDecodeError, TypeError, ValueError) as err:
            raise DrafterError(f"{where} is malformed ({err}): retrain the drafter or restore the file") from None


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class FeatureDrafter(nn.Module):
    def __init__(self, spec: FeatureDrafterSpec, *, lm_head_t: torch.Tensor, token_map: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor):
        """lm_head_t [h, V] the base LM head; token_map [N] sub-vocabulary ids; cos/sin [P, D/2] the
        base model's rotary table (export/decoder.rotary_table) for positions < P."""
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        if tuple(lm_head_t.shape) != (h, spec.vocab_size) or tuple(token_map.shape) != (spec.subvocab_size,):
            raise DrafterError(f"the base LM head {tuple(lm_head_t.shape)} or token map {tuple(token_map.shape)} does "
                               f"not fit the drafter (h={h}, V={spec.vocab_size}, N={spec.subvocab_size})")
        self.spec = spec
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.input_norm = RMSNorm(h, spec.rms_norm_eps)
        self.qkv = nn.Linear(h, (spec.num_heads + 2 * spec.num_kv_heads) * d, bias=False)
        self.o_proj = nn.Linear(spec.num_heads * d, h, bias=False)
        self.post_norm = RMSNorm(h, spec.rms_norm_eps)
        self.gate = nn.Linear(h, spec.intermediate_size, bias=False)
        self.up = nn.Linear(h, spec.intermediate_size, bias=False)
        self.down = nn.Linear(spec.intermediate_size, h, bias=False)
        self.norm = RMSNorm(h, spec.rms_norm_eps)
        # buffers, typed for the reader (nn.Module's attribute lookup is untyped)
        self.token_map: torch.Tensor
        self.projection: torch.Tensor
        self.cos_cache: torch.Tensor
        self.sin_cache: torch.Tensor
        self.register_buffer("token_map", token_map.long())  # [N] sub-vocabulary index → token id
        self.register_buffer("projection", lm_head_t.detach()[:, token_map.long()].contiguous(),
                             persistent=False)  # [h, N]
        self.register_buffer("cos_cache", cos.contiguous(), persistent=False)  # [P, D/2]
        self.register_buffer("sin_cache", sin.contiguous(), persistent=False)

    # ---- shared pieces ----
    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = self.post_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))

    def _head(self, g: torch.Tensor) -> torch.Tensor:
        return g @ self.projection  # [..., N]

    # ---- training: causal over S rows ----
    def _attend(self, x: torch.Tensor, positions: torch.Tensor, keys: list[torch.Tensor],
                values: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """x [B, S, h] → the layer's output g [B, S, h]; this pass's K/V [B, H_kv, S, D] are appended to
        keys/values, and the rows attend to all of them under mask [B or 1, 1, S, len(keys) * S]."""
        s = self.spec
        batch, rows, _ = x.shape
        q, k, v = self.qkv(self.input_norm(x)).split(
            [s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim], dim=-1)
        cos, sin = self.cos_cache[positions].unsqueeze(1), self.sin_cache[positions].unsqueeze(1)  # [B, 1, S, D/2]
        q = apply_rotary(q.view(batch, rows, s.num_heads, s.head_dim).transpose(1, 2), cos, sin)
        keys.append(apply_rotary(k.view(batch, rows, s.num_kv_heads, s.head_dim).transpose(1, 2), cos, sin))
        values.append(v.view(batch, rows, s.num_kv_heads, s.head_dim).transpose(1, 2))
        group = s.num_heads // s.num_kv_heads
        k = torch.cat(keys, dim=2).repeat_interleave(group, dim=1)
        v = torch.cat(values, dim=2).repeat_interleave(group, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, S, D]
        x = x + self.o_proj(attn.transpose(1, 2).reshape(batch, rows, s.num_heads * s.head_dim))
        return self.norm(self._mlp(x))

    def forward(self, features: torch.Tensor, next_embeds: torch.Tensor, positions: torch.Tensor,
                key_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """features, next_embeds [B, S, h], positions [B, S] (t + 1), key_mask [B, S] bool (False: padding)
        → (predicted next features [B, S, h], logits [B, S, N])."""
        (g, logits), = self.unroll(features, next_embeds, positions, key_mask, depths=1)
        return g, logits

    def unroll(self, features: torch.Tensor, next_embeds: torch.Tensor, positions: torch.Tensor,
               key_mask: torch.Tensor | None = None, *, depths: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The drafter as the runtime unrolls it, for every row at once ("training-time test"): pass p
        (1..depths) row i is the depth-p draft row after a real prefix of rows ≤ i - p + 1 — its feature
        is pass p-1's prediction at row i - 1 (pass 1: the real f_i), its token the real token i + 1, and
        it attends to pass-1 rows j ≤ i - p + 1 and to pass-q row i - (p - q) for q = 2..p (its
        ancestors' rows and its own), as runtime/drafters/feature.py grows a tree. Its logits guess
        token i + 2, as pass 1's do; rows i < p - 1 have no real prefix (callers mask them).
        → [(g [B, S, h], logits [B, S, N]) per pass]."""
        rows = features.shape[1]
        i = torch.arange(rows, device=features.device)[:, None]
        j = torch.arange(rows, device=features.device)[None]
        keys: list[torch.Tensor] = []  # K/V [B, H_kv, S, D] of every pass so far
        values: list[torch.Tensor] = []
        out: list[tuple[torch.Tensor, torch.Tensor]] = []
        feature = features
        for p in range(1, depths + 1):
            if p > 1:  # row i takes the previous pass's prediction at row i - 1
                previous = out[-1][0]
                feature = torch.cat([torch.zeros_like(previous[:, :1]), previous[:, :-1]], dim=1)
            blocks = [j <= i - p + 1] + [j == i - (p - q) for q in range(2, p + 1)]
            mask = torch.cat(blocks, dim=1)[None, None]  # [1, 1, S, p * S]
            if key_mask is not None:
                mask = mask & key_mask.repeat(1, p)[:, None, None, :]  # [B, 1, S, p * S]
            g = self._attend(self.fc(torch.cat([feature, next_embeds], dim=-1)), positions, keys, values, mask)
            out.append((g, self._head(g)))
        return out

    # ---- the exported step: W rows on a fixed KV buffer ----
    def step(self, features, next_embeds, position_ids, attention_bias, past_key, past_value):
        """features, next_embeds [B, W, h], position_ids [B, W], attention_bias [B, 1, W, S], past [B, H_kv, C, D]
        → (features out [B, W, h], logits [B, W, N], present_key, present_value); the W rows' K/V go to [S - W, S)."""
        s = self.spec
        total = attention_bias.shape[-1]
        seqlens_k = torch.full((features.shape[0],), total - 1, dtype=torch.int32)
        total_len = torch.full((), total, dtype=torch.int32)
        x = self.fc(torch.cat([features, next_embeds], dim=-1))
        attn, present_key, present_value = torch.ops.specmemo.group_query_attention(
            self.qkv(self.input_norm(x)), past_key, past_value, seqlens_k, total_len, self.cos_cache, self.sin_cache,
            position_ids, attention_bias, s.num_heads, s.num_kv_heads, s.head_dim**-0.5)
        g = self.norm(self._mlp(x + self.o_proj(attn)))
        return g, self._head(g), present_key, present_value

    def state_to_save(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().contiguous() for name, t in self.state_dict().items()}


def save_drafter(drafter: FeatureDrafter, folder: Path, spec: FeatureDrafterSpec | None = None) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.cpu() for k, v in drafter.state_to_save().items()}, str(folder / DRAFTER_FILE))
    (folder / DRAFTER_SPEC_FILE).write_text((spec or drafter.spec).to_json() + "\n")
    return folder


def load_drafter_spec(folder: Path) -> FeatureDrafterSpec:
    path = Path(folder) / DRAFTER_SPEC_FILE
    if not path.is_file():
        raise DrafterError(f"no {DRAFTER_SPEC_FILE} in {folder}: "
                           f"train one with `specmemo train drafter --out {folder}`")
    return FeatureDrafterSpec.from_json(path.read_text(), str(path))


def trained_on_dtype(folder: Path) -> str:
    """The weight dtype of the artifact whose features a drafter was trained on (its card's feature-cache
    settings, "sha|dtype"); float32 when it was trained from the torch model."""
    train = load_drafter_spec(folder).card.get("train", {})
    artifact = json.loads(train["features"]).get("artifact", "") if train.get("features", "").startswith("{") else ""
    return artifact.split("|")[1] if "|" in artifact else "float32"


def load_drafter_state(folder: Path, *, base_sha256: str = "") -> tuple[FeatureDrafterSpec, dict[str, torch.Tensor]]:
    """(spec, tensors) of a drafter folder, refused when it was trained on other base weights."""
    from safetensors.torch import load_file

    spec = load_drafter_spec(folder)
    if base_sha256 and spec.base_sha256 and spec.base_sha256 != base_sha256:
        raise DrafterError(f"{folder} was trained on base weights {spec.base_sha256[:16]}, not {base_sha256[:16]}: "
                           f"train a drafter for this model")
    path = Path(folder) / DRAFTER_FILE
    if not path.is_file():
        raise DrafterError(f"{path} is missing: retrain the drafter or restore the file")
    return spec, load_file(str(path))


def load_drafter(folder: Path, *, lm_head_t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 base_sha256: str = "") -> FeatureDrafter:
    spec, state = load_drafter_state(folder, base_sha256=base_sha256)
    path = Path(folder) / DRAFTER_FILE
    drafter = FeatureDrafter(spec, lm_head_t=lm_head_t, token_map=state["token_map"], cos=cos, sin=sin)
    try:
        missing, unexpected = drafter.load_state_dict(state, strict=False)
    except RuntimeError as err:  # a weight of another shape than drafter.json says
        first = next((line.strip() for line in str(err).splitlines() if "size mismatch" in line), str(err)[:200])
        raise DrafterError(f"{path} does not fit its drafter.json ({first}): retrain, or restore the folder's "
                           f"drafter.json") from None
    if missing or unexpected:
        raise DrafterError(f"{path} does not fit its drafter.json (missing {missing[:2]}, unexpected {unexpected[:2]})")
    return drafter.eval()
