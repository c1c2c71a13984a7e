/**
 * The arena (runtime/arena.py): every buffer a generation touches, sized by arithmetic, allocated
 * once as one ArrayBuffer and carved into named typed-array views. The layout, its order, dtypes,
 * shapes and 64-byte alignment are the Python runtime's, so both allocate the same number of bytes
 * for the same sizes (tests check it against Python's ArenaLayout).
 *
 *   kv.{i}            [B, H_kv, C, D]  past and present of one KV input/output pair, updated in place
 *   input_ids         [R]      int64   the step's tokens, looked up into inputs_embeds
 *   inputs_embeds     [R * h]
 *   position_ids      [R]      int64
 *   attention_bias    [R * C]          a [B, 1, T, S] step uses its first T * S elements
 *   logits_indices    [R]      int64
 *   logits            [N * V]
 *   next_token_ids    [R]      int64
 *   hidden_states     [R * h]
 *   heads_hidden      [B, h]           the Medusa heads' input
 *   heads_token_ids   [B, K, k] int64
 *   heads_probs       [B, K, k]
 *   drafter_kv.{0,1}  [1, H_kv, C_d, D]  the feature drafter's KV, C_d = C + its scratch rows, when it runs
 */

import { ConfigError } from './errors';
import { Manifest } from './manifest';
import { Sizes } from './sizes';
import { SHARED } from './shared';

export const ALIGN = SHARED.arena_align; // bytes; every view starts on a cache line

export type DType = 'float32' | 'float16' | 'int64';
export type View = Float32Array | Uint16Array | BigInt64Array;
const ITEMSIZE: Record<DType, number> = { float32: 4, float16: 2, int64: 8 };

export interface ViewSpec {
  name: string;
  dtype: DType;
  shape: number[];
}

export interface ArenaLayout {
  numLayers: number; // L
  numKvHeads: number; // H_kv
  headDim: number; // D
  hiddenSize: number; // h
  vocabSize: number; // V
  capacity: number; // C
  rows: number; // R
  logitRows: number; // N
  numHeads: number; // K Medusa heads (0: none)
  topK: number; // k
  kvDtype: 'float32' | 'float16';
  batch: number; // B
  drafterCapacity?: number; // C_d rows of the feature drafter's KV (absent or 0: none)
}

export function layoutFor(m: Manifest, sizes: Sizes, withHeads: boolean): ArenaLayout {
  const d = m.dims;
  const heads = withHeads ? m.heads : null;
  const layout: ArenaLayout = {
    numLayers: d.num_layers, numKvHeads: d.num_kv_heads, headDim: d.head_dim, hiddenSize: d.hidden_size,
    vocabSize: d.vocab_size, capacity: sizes.capacity, rows: sizes.rows, logitRows: sizes.tree,
    numHeads: heads ? heads.num_heads : 0, topK: heads ? heads.top_k : 0, kvDtype: m.kv_dtype, batch: 1,
  };
  if (layout.capacity < 2 || layout.rows < 1 || layout.logitRows < 1 || layout.logitRows > layout.rows) {
    throw new ConfigError(`arena needs capacity >= 2, rows >= 1 and 1 <= logit rows <= rows (got ${layout.capacity}, ${layout.rows}, ${layout.logitRows})`);
  }
  return layout;
}

/** (name, dtype, shape) of every buffer, in allocation order. */
export function views(l: ArenaLayout): ViewSpec[] {
  const b = l.batch;
  const r = l.rows;
  const kv = [b, l.numKvHeads, l.capacity, l.headDim];
  const out: ViewSpec[] = Array.from({ length: 2 * l.numLayers }, (_, i) => ({ name: `kv.${i}`, dtype: l.kvDtype, shape: kv }));
  out.push(
    { name: 'input_ids', dtype: 'int64', shape: [b * r] },
    { name: 'inputs_embeds', dtype: 'float32', shape: [b * r * l.hiddenSize] },
    { name: 'position_ids', dtype: 'int64', shape: [b * r] },
    { name: 'attention_bias', dtype: 'float32', shape: [b * r * l.capacity] },
    { name: 'logits_indices', dtype: 'int64', shape: [b * r] },
    { name: 'logits', dtype: 'float32', shape: [b * l.logitRows * l.vocabSize] },
    { name: 'next_token_ids', dtype: 'int64', shape: [b * r] },
    { name: 'hidden_states', dtype: 'float32', shape: [b * r * l.hiddenSize] },
  );
  if (l.numHeads) {
    const heads = [b, l.numHeads, l.topK];
    out.push({ name: 'heads_hidden', dtype: 'float32', shape: [b, l.hiddenSize] },
      { name: 'heads_token_ids', dtype: 'int64', shape: heads }, { name: 'heads_probs', dtype: 'float32', shape: heads });
  }
  if (l.drafterCapacity) {
    const drafterKv = [1, l.numKvHeads, l.drafterCapacity, l.headDim];
    out.push({ name: 'drafter_kv.0', dtype: l.kvDtype, shape: drafterKv }, { name: 'drafter_kv.1', dtype: l.kvDtype, shape: drafterKv });
  }
  return out;
}

const aligned = (size: number): number => Math.ceil(size / ALIGN) * ALIGN;
const elements = (shape: number[]): number => shape.reduce((a, b) => a * b, 1);

/** Byte offset of each view; '<end>' is where the last one (aligned) ends. */
export function offsets(l: ArenaLayout): Map<string, number> {
  const out = new Map<string, number>();
  let at = 0;
  for (const v of views(l)) {
    out.set(v.name, at);
    at += aligned(ITEMSIZE[v.dtype] * elements(v.shape));
  }
  out.set('<end>', at);
  return out;
}

/** What the arena allocates: the views laid end to end plus ALIGN bytes of slack (as Python allocates). */
export function allocationBytes(l: ArenaLayout): number {
  return offsets(l).get('<end>')! + ALIGN;
}

export function kvBytes(l: ArenaLayout): number {
  return views(l).filter((v) => v.name.startsWith('kv.')).reduce((sum, v) => sum + aligned(ITEMSIZE[v.dtype] * elements(v.shape)), 0);
}

/** One allocation of allocationBytes(layout), carved into the layout's views (zero-filled). */
export class Arena {
  readonly buffer: ArrayBuffer;
  private readonly named = new Map<string, View>();

  constructor(readonly layout: ArenaLayout) {
    this.buffer = new ArrayBuffer(allocationBytes(layout));
    const at = offsets(layout);
    for (const v of views(layout)) {
      const start = at.get(v.name)!;
      const n = elements(v.shape);
      const view = v.dtype === 'float32' ? new Float32Array(this.buffer, start, n)
        : v.dtype === 'float16' ? new Uint16Array(this.buffer, start, n) : new BigInt64Array(this.buffer, start, n);
      this.named.set(v.name, view);
    }
  }

  f32(name: string): Float32Array {
    return this.named.get(name) as Float32Array;
  }

  i64(name: string): BigInt64Array {
    return this.named.get(name) as BigInt64Array;
  }

  view(name: string): View {
    const view = this.named.get(name);
    if (view === undefined) throw new RangeError(`the arena has no view ${JSON.stringify(name)}`);
    return view;
  }

  /** 2L views [B, H_kv, C, D], in the manifest's kv_pairs order. */
  kv(): View[] {
    return Array.from({ length: 2 * this.layout.numLayers }, (_, i) => this.named.get(`kv.${i}`)!);
  }

  get nbytes(): number {
    return this.buffer.byteLength;
  }
}
