"""The manifest's graphs: the decoder's I/O names, and the graphs beside it (Medusa heads, the
feature drafter, the batch decoders, the rows graph), each with the names a runtime binds."""

from __future__ import annotations

from dataclasses import dataclass

from specmemo.errors import ManifestError

MAX_FEATURE_DEPTH = 8  # the deepest draft a feature drafter's entry may ask for


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple[int | str, ...]  # ints are fixed, strings are symbolic axes (B, T, S, C)


@dataclass(frozen=True)
class DecoderIO:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    inputs_embeds: str
    position_ids: str
    attention_bias: str
    logits_indices: str
    logits: str
    next_token_ids: str
    hidden_states: str
    kv_pairs: tuple[tuple[str, str], ...]  # (past input, present output) bound to one buffer
    attention_bias_local: str = ""  # [B, 1, T, S_w]: the sliding layers' bias over their own buffer ("": none)
    write_position: str = ""  # [B] int64: where the call's K/V rows go, S - T (grouped attention; "": none)
    write_position_local: str = ""  # [B] the same in the sliding layers' buffers, S_w - T


@dataclass(frozen=True)
class SharedInitializer:
    """One weight two graphs use (the shared LM head): stored once in `file`; the runtime loads it
    once and hands the same memory to both sessions under their names."""

    decoder_name: str
    heads_name: str
    file: str  # relative to the artifact folder
    offset: int  # bytes
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class HeadsInfo:
    """The Medusa heads graph: hidden [B, h] → top-k ids and probabilities [B, K, k] per head."""

    file: str
    data_file: str
    hidden: str  # input name
    token_ids: str  # output [B, K, k] int64
    probs: str  # output [B, K, k]
    num_heads: int  # K
    top_k: int  # k
    mode: str  # shared | own | subvocab
    subvocab_size: int
    tree: tuple[tuple[int, ...], ...]  # Medusa choices; every prefix is a valid tree (pruning = prefix)
    accuracy: tuple[tuple[float, ...], ...] = ()  # [K][k] cumulative top-1..top-k accuracy (eval-heads)
    source: str = ""  # where the heads came from
    shared_lm_head: SharedInitializer | None = None  # the LM head read from the decoder's data file, if shared

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.top_k < 1:
            raise ManifestError(f"heads: num_heads and top_k must be >= 1, got {self.num_heads}, {self.top_k}")
        for choice in self.tree:
            if len(choice) > self.num_heads or max(choice) >= self.top_k:
                raise ManifestError(f"heads.tree: choice {list(choice)} needs more than {self.num_heads} heads "
                                    f"or rank >= top_k {self.top_k}: re-export the artifact")


@dataclass(frozen=True)
class FeatureDrafterInfo:
    """The feature drafter's graph (export/drafter_graph.py): W rows on its own KV buffer of
    `capacity` rows → next features, top-k ids and probabilities."""

    file: str
    data_file: str
    inputs: tuple[str, ...]  # features, embeds, position_ids, attention_bias, past_key, past_value
    outputs: tuple[str, ...]  # features_out, top_ids, top_probs, present_key, present_value
    top_k: int  # k guesses per row
    capacity: int  # C_d rows of its KV buffer: the decoder's max capacity + room for the draft tree
    subvocab_size: int  # N
    source: str = ""  # the drafter folder it was exported from
    accuracy: tuple[float, ...] = ()  # top-1 per depth, from eval-drafter (for the card)
    # what the runtime drafts (export decides them: export/exporter.py); the defaults are what artifacts
    # written before these keys drafted
    depth: int = 2  # depths drafted at most (the catch-up row gives the first; each further one is a call)
    width: int = 4  # nodes expanded per further depth

    def __post_init__(self) -> None:
        if len(self.inputs) != 6 or len(self.outputs) != 5:
            raise ManifestError("feature_drafter: expected 6 inputs and 5 outputs: re-export the artifact")
        if self.top_k < 1 or self.capacity < 2:
            raise ManifestError(f"feature_drafter: top_k {self.top_k} and capacity {self.capacity} must be >= 1, >= 2")
        if not 1 <= self.depth <= MAX_FEATURE_DEPTH or self.width < 1:
            raise ManifestError(f"feature_drafter: depth {self.depth} must be in 1..{MAX_FEATURE_DEPTH} and width "
                                f"{self.width} >= 1: re-export the artifact")
        if self.capacity < self.scratch_slots + 2:
            raise ManifestError(f"feature_drafter: capacity {self.capacity} leaves no room beside its "
                                f"{self.scratch_slots} scratch rows: re-export the artifact")

    @property
    def scratch_slots(self) -> int:
        """KV rows beyond the decoder's C for the draft tree's rows: WIDTH per further depth (one depth spare)."""
        return self.depth * self.width


@dataclass(frozen=True)
class BatchGraph:
    """The decoder for B sequences in one call (export/batch_graph.py): the rows' tokens laid end to end
    on the token axis ([1, n_0 + ... + n_{B-1}, h]), one GroupQueryAttention per row and layer over the
    row's own KV buffers and bias, on T_b = n_b + 1 attention rows (the row's tokens and a padding row,
    gathered by `attention_rows`). Inputs and outputs not named here are named as in `DecoderIO`
    (position_ids is not an input: `attention_position_ids` carries the positions)."""

    batch: int  # B
    file: str  # its graph; the weights are the decoder's own data file
    attention_bias: tuple[str, ...]  # [B] inputs [1, 1, T_b, S_b]
    kv_pairs: tuple[tuple[str, str], ...]  # [B * 2L] (past, present), row b's 2L pairs at [b * 2L, (b + 1) * 2L)
    attention_bias_local: tuple[str, ...] = ()  # [B] inputs [1, 1, T_b, S_w_b]: the sliding layers' (when any)
    attention_rows: str = "attention_rows"  # [A] int64, A = sum T_b: the token each attention row takes
    attention_position_ids: str = "attention_position_ids"  # [1, A] int64
    token_rows: str = "token_rows"  # [n] int64: the attention row of each token (its output)
    write_position: tuple[str, ...] = ()  # [B] inputs [1]: row b's write position (grouped attention; (): none)
    write_position_local: tuple[str, ...] = ()  # [B] inputs [1]: its sliding layers' (when any)

    def __post_init__(self) -> None:
        if (self.batch < 2 or len(self.attention_bias) != self.batch or len(self.kv_pairs) % self.batch
                or len(self.attention_bias_local) not in (0, self.batch)):
            raise ManifestError(f"batch_graphs: a graph for {self.batch} rows names {len(self.attention_bias)} biases "
                                f"and {len(self.kv_pairs)} KV pairs: re-export the artifact")


@dataclass(frozen=True)
class RowsGraph:
    """The decoder with its K/V buffers as inputs only (export/rows_graph.py), for runtimes whose binding copies every
    output back (the TypeScript engine): the call's new K/V rows come out as one output, [2·layers·B, H_kv, T, D] in
    kv_pairs order, and the runtime writes them into its buffers at [S - T, S). Other names are the decoder's."""

    file: str  # its graph; the weights are the decoder's own data file
    kv_rows: str  # the output

    def __post_init__(self) -> None:
        if not self.file or not self.kv_rows:
            raise ManifestError("rows_graph: file and kv_rows must be named: re-export the artifact")
