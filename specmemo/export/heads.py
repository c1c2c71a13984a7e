"""Medusa heads: K small residual stacks on the base model's last hidden state, each drafting one
future token (head k, counted from 0, guesses the token k + 2 places after the hidden state's
position; the base model's own LM head gives the next one).

    head_k(x) = project_k(block_k,n(... block_k,1(x)))      block(x) = x + SiLU(x W + b), W, b zero at init

The projection onto the vocabulary decides the memory cost (h hidden, V vocab, N sub-vocabulary):
  shared   – the base model's LM head [h, V], reused: no extra h×V matrix (the default);
  own      – one [V, h] matrix per head, the FasterDecoding/Medusa checkpoint layout;
  subvocab – the base LM head's rows for the N most frequent tokens of the training data only
             (frequency-ranked, as in FR-Spec); `token_map [N]` maps back to vocabulary ids.

Files (in a heads folder): `heads.safetensors` (blocks, own projections, token_map) and
`heads.json` (HeadsSpec: dims, mode, the Medusa tree and the accuracy table). Nothing is pickled.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path

import torch
from torch import nn

from specmemo.errors import SpecMemoError

HEADS_FILE = "heads.safetensors"
SPEC_FILE = "heads.json"
HEADS_FORMAT = 1


class HeadsError(SpecMemoError, ValueError):
    """Heads missing, malformed, or made for another base model."""


class ProjectionMode(StrEnum):
    SHARED = "shared"
    OWN = "own"
    SUBVOCAB = "subvocab"


@dataclass(frozen=True)
class HeadsSpec:
    hidden_size: int  # h, must equal the base model's
    vocab_size: int  # V, must equal the base model's
    num_heads: int = 3  # K
    num_layers: int = 1  # residual blocks per head
    mode: ProjectionMode = ProjectionMode.SHARED
    subvocab_size: int = 0  # N, subvocab mode only
    base_sha256: str = ""  # the weights the heads were trained on ("" = unknown)
    tree: tuple[tuple[int, ...], ...] = ()  # Medusa choices, every prefix a valid tree
    accuracy: tuple[tuple[float, ...], ...] = ()  # [K][top-k] cumulative accuracy, from eval-heads
    card: dict = field(default_factory=dict)  # how the heads were made (command, data, seed, ...)
    format: int = HEADS_FORMAT

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", ProjectionMode(self.mode))
        for name in ("hidden_size", "vocab_size", "num_heads", "num_layers"):
            if getattr(self, name) < 1:
                raise HeadsError(f"heads.{name} must be >= 1, got {getattr(self, name)}")
        if self.mode is ProjectionMode.SUBVOCAB and not 1 <= self.subvocab_size <= self.vocab_size:
            raise HeadsError(f"subvocab mode needs 1 <= subvocab_size <= {self.vocab_size}, got {self.subvocab_size}")
        if self.mode is not ProjectionMode.SUBVOCAB and self.subvocab_size:
            raise HeadsError(f"subvocab_size is only meaningful in subvocab mode, not {self.mode.value}")
        if any(len(choice) > self.num_heads for choice in self.tree):
            raise HeadsError(f"the tree is deeper than the {self.num_heads} heads")
        if self.format != HEADS_FORMAT:
            raise HeadsError(f"heads format {self.format} is not {HEADS_FORMAT}: retrain or re-save the heads")

    def to_json(self) -> str:
        data = asdict(self)
        data["mode"] = self.mode.value
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str) -> HeadsSpec:
        try:
            data = json.loads(text)
            data["tree"] = tuple(tuple(c) for c in data.get("tree", ()))
            data["accuracy"] = tuple(tuple(a) for a in data.get("accuracy", ()))
            return cls(**data)
        except HeadsError:
            raise
        except (json.JSONDecodeError, TypeError, ValueError, KeyError) as err:
            raise HeadsError(f"{where} is malformed ({err}): retrain the heads or restore the file") from None


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)  # identity at init: each head starts as the base LM head
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """forward(hidden [..., h]) → logits [..., K, V'] with V' = V (shared, own) or N (subvocab).

    `lm_head_t [h, V]` is the base model's LM head (frozen, not part of the heads' state): shared
    mode projects through it, subvocab mode through its `token_map` columns."""

    def __init__(self, spec: HeadsSpec, lm_head_t: torch.Tensor, token_map: torch.Tensor | None = None):
        super().__init__()
        if tuple(lm_head_t.shape) != (spec.hidden_size, spec.vocab_size):
            raise HeadsError(
                f"base LM head is {tuple(lm_head_t.shape)} but the heads expect "
                f"[{spec.hidden_size}, {spec.vocab_size}]: use heads trained for this base model"
            )
        self.spec = spec
        # buffers and parameters set below, typed for the reader (nn.Module's attribute lookup is untyped)
        self.lm_head_t: torch.Tensor
        self.own: nn.Parameter | None
        self.token_map: torch.Tensor | None
        self.projection: torch.Tensor  # subvocab mode only
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(spec.hidden_size) for _ in range(spec.num_layers))) for _ in range(spec.num_heads)
        )
        self.register_buffer("lm_head_t", lm_head_t.detach(), persistent=False)  # [h, V], frozen
        self.own = None
        if spec.mode is ProjectionMode.OWN:  # [K, V, h], initialised from the base LM head
            self.own = nn.Parameter(lm_head_t.detach().t().unsqueeze(0).repeat(spec.num_heads, 1, 1).contiguous())
        if spec.mode is ProjectionMode.SUBVOCAB:
            if token_map is None or token_map.shape != (spec.subvocab_size,):
                raise HeadsError(f"subvocab heads need a token_map of {spec.subvocab_size} ids")
            self.register_buffer("token_map", token_map.long())  # [N] sub-vocabulary index → token id
            # [h, N] the base LM head's columns for those tokens, gathered once (not per call)
            self.register_buffer("projection", lm_head_t.detach()[:, self.token_map].contiguous(), persistent=False)
        else:
            self.token_map = None

    def drafts(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., h] → [..., K, h]
        return torch.stack([block(hidden) for block in self.blocks], dim=-2)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        drafts = self.drafts(hidden)  # [..., K, h]
        if self.own is not None:
            return torch.einsum("...kh,kvh->...kv", drafts, self.own)  # [..., K, V]
        if self.token_map is not None:
            return drafts @ self.projection  # [..., K, N]
        return drafts @ self.lm_head_t  # [..., K, V]

    def top_k(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [..., h] → (token ids [..., K, k] int64, probabilities [..., K, k]), best first.
        The heads graph is this function traced, so torch and ORT compute the same thing."""
        logits = self(hidden)  # [..., K, V']
        values, indices = logits.topk(k, dim=-1)
        # softmax at the top k only: log-sum-exp written out around the top-1 logit, because ORT's
        # ReduceLogSumExp lost precision here against float64; this form keeps it
        top = values[..., :1]
        log_sum = top + torch.log(torch.exp(logits - top).sum(dim=-1, keepdim=True))
        probs = torch.exp(values - log_sum)
        if self.token_map is not None:
            indices = self.token_map[indices]
        return indices, probs

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """What the heads own: blocks, own projections, token map (never the base LM head)."""
        return {name: t.detach().contiguous() for name, t in self.state_dict().items()}


def to_subvocab(heads: MedusaHeads, token_map: torch.Tensor) -> MedusaHeads:
    """The same trained blocks projected through the base LM head's `token_map` columns only: a
    shared head restricted to N tokens. Ranks among those tokens are unchanged, so a guess is lost
    only when the right token lies outside them; the heads graph reads an [h, N] slice, not [h, V]."""
    if heads.spec.mode is not ProjectionMode.SHARED:
        raise HeadsError(f"only shared heads can be restricted to a sub-vocabulary (these are {heads.spec.mode.value})")
    card = {**heads.spec.card, "derived": f"shared heads restricted to the {len(token_map)} tokens the base model "
                                          f"predicts most often on the training data (no retraining)"}
    spec = replace(heads.spec, mode=ProjectionMode.SUBVOCAB, subvocab_size=len(token_map), tree=(), accuracy=(),
                   card=card)
    derived = MedusaHeads(spec, heads.lm_head_t, token_map)
    derived.blocks.load_state_dict(heads.blocks.state_dict())
    return derived


def save_heads(heads: MedusaHeads, folder: Path, spec: HeadsSpec | None = None) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(heads.trainable_state(), str(folder / HEADS_FILE))
    (folder / HEADS_FILE).chmod(0o644)  # safetensors writes 0600; heads are shared files like the rest
    (folder / SPEC_FILE).write_text((spec or heads.spec).to_json() + "\n")
    return folder


def load_spec(folder: Path) -> HeadsSpec:
    path = Path(folder) / SPEC_FILE
    if not path.is_file():
        raise HeadsError(f"no {SPEC_FILE} in {folder}: train heads with `specmemo train heads --out {folder}`")
    return HeadsSpec.from_json(path.read_text(), str(path))


def load_heads(folder: Path, lm_head_t: torch.Tensor, *, base_sha256: str = "") -> MedusaHeads:
    """Our format (heads.json + heads.safetensors), checked against the base model's LM head."""
    from safetensors.torch import load_file

    folder = Path(folder)
    spec = load_spec(folder)
    if spec.base_sha256 and base_sha256 and spec.base_sha256 != base_sha256:
        raise HeadsError(
            f"heads in {folder} were trained on weights {spec.base_sha256[:12]}, not {base_sha256[:12]}: "
            f"train heads for this model with `specmemo train heads`"
        )
    weights = folder / HEADS_FILE
    if not weights.is_file():
        raise HeadsError(f"{weights} is missing: retrain the heads or restore the file")
    state = load_file(str(weights))
    token_map = state.get("token_map")
    heads = MedusaHeads(spec, lm_head_t, token_map)
    _load_state(heads, state, str(weights))
    return heads


def _load_state(heads: MedusaHeads, state: dict[str, torch.Tensor], where: str) -> None:
    expected = heads.state_dict()
    missing = sorted(set(expected) - set(state))
    unknown = sorted(set(state) - set(expected))
    if missing or unknown:
        raise HeadsError(f"{where}: {'missing ' + missing[0] if missing else 'unexpected ' + unknown[0]} "
                         f"(the file does not match heads.json): retrain or restore the heads")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise HeadsError(f"{where}: {name} is {tuple(tensor.shape)}, expected {tuple(expected[name].shape)}: "
                             f"these heads were made for another base model")
    heads.load_state_dict(state)


def load_any_heads(folder: Path, lm_head_t: torch.Tensor, *, base_sha256: str = "") -> MedusaHeads:
    """Our heads folder (heads.json), or a FasterDecoding/Medusa checkpoint folder (config.json)."""
    folder = Path(folder)
    if (folder / SPEC_FILE).is_file():
        return load_heads(folder, lm_head_t, base_sha256=base_sha256)
    if (folder / "config.json").is_file():
        return load_medusa_checkpoint(folder, lm_head_t)
    raise HeadsError(f"{folder} holds neither {SPEC_FILE} nor a Medusa config.json: "
                     f"train heads with `specmemo train heads --out {folder}`")


# ---- FasterDecoding/Medusa checkpoints ------------------------------------------------------------
# A folder with config.json (medusa_num_heads, medusa_num_layers) and medusa_lm_head.safetensors
# (or .pt), whose keys are "{k}.{n}.linear.weight|bias" for block n of head k and
# "{k}.{num_layers}.weight" [V, h] for head k's own LM head.

def load_medusa_checkpoint(folder: Path, lm_head_t: torch.Tensor) -> MedusaHeads:
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise HeadsError(f"no config.json in {folder}: a Medusa checkpoint folder needs one (medusa_num_heads, ...)")
    try:
        config = json.loads(config_path.read_text())
        num_heads, num_layers = int(config["medusa_num_heads"]), int(config["medusa_num_layers"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise HeadsError(f"{config_path} lacks medusa_num_heads/medusa_num_layers ({err}): "
                         f"not a Medusa checkpoint") from None
    state = _read_medusa_weights(folder)
    hidden, vocab = lm_head_t.shape
    own_key = f"0.{num_layers}.weight"
    if own_key not in state:
        raise HeadsError(f"{folder}: no {own_key!r} (head 0's LM head): not a FasterDecoding Medusa checkpoint")
    found = tuple(state[own_key].shape)
    if found != (vocab, hidden):
        raise HeadsError(
            f"{folder}: Medusa LM heads are {found} [V, h] but the base model has V={vocab}, h={hidden}: "
            f"these heads belong to another base model"
        )
    spec = HeadsSpec(hidden_size=hidden, vocab_size=vocab, num_heads=num_heads, num_layers=num_layers,
                     mode=ProjectionMode.OWN, card={"source": f"FasterDecoding checkpoint {folder}"})
    block_keys = {f"blocks.{k}.{n}.linear.{part}": f"{k}.{n}.linear.{part}"  # ours: the checkpoint's
                  for k in range(num_heads) for n in range(num_layers) for part in ("weight", "bias")}
    own_keys = [f"{k}.{num_layers}.weight" for k in range(num_heads)]
    if any(key not in state for key in [*block_keys.values(), *own_keys]):
        raise HeadsError(f"{folder}: the checkpoint has fewer heads/layers than its config.json says")
    renamed = {name: state[key] for name, key in block_keys.items()}
    own = [state[key] for key in own_keys]
    if any(t.shape != (vocab, hidden) for t in own):
        raise HeadsError(f"{folder}: Medusa LM heads disagree in shape: the checkpoint is inconsistent")
    renamed["own"] = torch.stack(own)
    heads = MedusaHeads(spec, lm_head_t)
    _load_state(heads, {name: t.float() for name, t in renamed.items()}, str(folder))
    return heads


def _read_medusa_weights(folder: Path) -> dict[str, torch.Tensor]:
    safe, pickled = folder / "medusa_lm_head.safetensors", folder / "medusa_lm_head.pt"
    if safe.is_file():
        from safetensors.torch import load_file

        return load_file(str(safe))
    if pickled.is_file():  # weights_only: tensors only, never arbitrary pickled objects
        try:
            return torch.load(str(pickled), map_location="cpu", weights_only=True)
        except Exception as err:
            raise HeadsError(f"{pickled} is not a plain tensor checkpoint ({type(err).__name__}): "
                             f"convert it to safetensors") from None
    raise HeadsError(f"no medusa_lm_head.safetensors or medusa_lm_head.pt in {folder}")
