/**
 * The feature drafter (EAGLE family), step for step as the Python runtime drafts with it (runtime/drafters/feature.py):
 * its graph (drafter.onnx) unrolled into a tree.
 *
 * Rows and positions: drafter row t reads the base model's final hidden state f_t and the embedding of token t + 1,
 * sits at position t + 1 and predicts f_{t+1}; its top-k guess the token at t + 2. Row t's K/V live in slot t of the
 * drafter's own KV buffer; a slot is "filled" once its row was computed from the base model's real f_t.
 *
 *   catch up – rows for the positions committed since the last step (their f from the last call's hidden states),
 *              causal, into slots [first, L); the last row predicts f_L and its top-k are the root's children;
 *   grow     – each further depth, the `width` best nodes of the newest depth (by path score; those under
 *              MIN_EXPAND are not worth a call) get a row in scratch slots after L, attending to the filled slots
 *              and their ancestors' rows; its top-k become their children (`depth` depths at most);
 *   rank     – every node by score; the best `budget - 1` form the draft (draft.ts ordered).
 * A new reply (a new context list) starts afresh.
 */

import { DraftContext, DraftTree, Drafter, ordered } from './draft';
import { featureShape } from '../manifest';
import type { View } from '../arena';
import { DecoderSession, KVCache, OutputRoute } from '../session';
import { SHARED } from '../shared';

export const MIN_EXPAND: number = SHARED.feature.min_expand; // a depth is drafted while its best path score is at least this

/** One call of the drafter's graph: W rows (features and embeddings [W·h], positions [W], bias [W·S]) → next features
 * [W·h], top-k ids and probabilities [W·k]; the rows' K/V land in slots [S - W, S). */
export interface FeatureGraph {
  readonly capacity: number; // C_d: KV slots it may use
  readonly hiddenSize: number;
  readonly topK: number;
  run(features: Float32Array, tokens: readonly number[], positions: readonly number[], bias: Float32Array, attended: number):
    Promise<[Float32Array, number[], Float32Array]>;
}

export class FeatureDrafter implements Drafter {
  readonly name = 'feature';
  private readonly filled: Uint8Array; // [C_d] slots holding a real row
  private rows = 0; // rows computed so far: the next catch-up starts here
  private source: readonly number[] | null = null;

  constructor(readonly graph: FeatureGraph, readonly depth: number, readonly width: number) {
    this.filled = new Uint8Array(graph.capacity);
  }

  /** Rows for the newly committed positions; (f_L predicted, ids, probs) of the last, or null without a hidden state. */
  private async catchUp(context: DraftContext): Promise<[Float32Array, number[], Float32Array] | null> {
    const length = context.tokens.length - 1; // L: committed base positions (the root is token L)
    if (context.tokens !== this.source || length < this.rows) { // a new reply: start afresh
      this.filled.fill(0);
      this.rows = 0;
      this.source = context.tokens;
    }
    const h = this.graph.hiddenSize;
    const recent = recentStates(context, h); // hidden states of positions [L - n, L)
    const n = recent === null ? 0 : recent.length / h;
    if (n === 0 || length + 1 > this.graph.capacity) return null;
    const first = Math.max(this.rows, length - n);
    if (first >= length) return null;
    const count = length - first; // row t (first <= t < L): f_t, token t + 1, position t + 1, slot t
    const features = recent!.subarray((n - count) * h);
    const bias = new Float32Array(count * length);
    for (let r = 0; r < count; r++) {
      for (let s = 0; s < length; s++) {
        const own = s >= first ? s - first <= r : this.filled[s] === 1; // causal among the new rows
        bias[r * length + s] = own ? 0 : -Infinity;
      }
    }
    const rows = Array.from({ length: count }, (_, r) => first + r);
    const [out, ids, probs] = await this.graph.run(features, rows.map((t) => context.tokens[t + 1]), rows.map((t) => t + 1), bias, length);
    this.filled.fill(1, first, length);
    this.rows = length;
    const k = this.graph.topK;
    return [out.slice((count - 1) * h, count * h), ids.slice((count - 1) * k, count * k), probs.slice((count - 1) * k, count * k)];
  }

  async propose(context: DraftContext, budget: number): Promise<DraftTree> {
    const root = context.tokens[context.tokens.length - 1];
    if (context.ahead) return DraftTree.rootOnly(root); // no hidden states for the tokens before the root yet
    const start = await this.catchUp(context);
    if (start === null || budget <= 1) return DraftTree.rootOnly(root);
    const length = context.tokens.length - 1;
    const h = this.graph.hiddenSize;
    const k = this.graph.topK;
    const [feature, firstIds, firstProbs] = start;
    const tokens = [root];
    const parents = [-1];
    const scores = [1];
    const slotOf = new Map<number, number>([[0, length - 1]]); // node → the slot of the row that predicted its children
    const predicted = new Map<number, Float32Array>([[0, feature]]); // node → the feature its row predicted
    let newest: number[] = [];
    firstIds.forEach((token, j) => {
      tokens.push(token);
      parents.push(0);
      scores.push(firstProbs[j]);
      newest.push(tokens.length - 1);
    });
    let used = length; // next scratch slot
    for (let depth = 1; depth < this.depth; depth++) {
      const expand = [...newest].sort((a, b) => scores[b] - scores[a]).slice(0, this.width).filter((n) => scores[n] >= MIN_EXPAND);
      if (!expand.length || used + expand.length > this.graph.capacity || tokens.length >= 4 * budget) break;
      const total = used + expand.length; // S: the rows go to slots [used, total)
      const bias = new Float32Array(expand.length * total).fill(-Infinity);
      expand.forEach((node, r) => {
        for (let s = 0; s < length; s++) if (this.filled[s]) bias[r * total + s] = 0;
        for (let walk = parents[node]; walk > 0; walk = parents[walk]) bias[r * total + slotOf.get(walk)!] = 0;
        bias[r * total + used + r] = 0;
      });
      const features = new Float32Array(expand.length * h);
      expand.forEach((node, r) => features.set(predicted.get(parents[node])!, r * h));
      const [out, ids, probs] = await this.graph.run(features, expand.map((node) => tokens[node]), expand.map(() => length + depth), bias, total);
      newest = [];
      expand.forEach((node, r) => {
        slotOf.set(node, used + r);
        predicted.set(node, out.slice(r * h, (r + 1) * h));
        for (let j = 0; j < k; j++) {
          tokens.push(ids[r * k + j]);
          parents.push(node);
          scores.push(scores[node] * probs[r * k + j]);
          newest.push(tokens.length - 1);
        }
      });
      used = total;
    }
    return ordered(tokens, parents, scores, budget);
  }
}

/** [n·h] hidden states of the positions the last decoder call committed, in order (runtime/drafters/draft.py recent). */
export function recentStates(context: DraftContext, hiddenSize: number): Float32Array | null {
  const rows = context.rows;
  if (rows === undefined) return null;
  if (context.path === undefined) return rows;
  const out = new Float32Array(context.path.length * hiddenSize);
  context.path.forEach((node, i) => out.set(rows.subarray(node * hiddenSize, (node + 1) * hiddenSize), i * hiddenSize));
  return out;
}

/**
 * drafter.onnx in ONNX Runtime (runtime/drafters/feature.py OrtFeatureGraph): W rows' features and tokens (embedded
 * here), positions and bias → next features and top-k guesses; its K/V views in the session's arena handed as both
 * past and present, so the rows land in slots [S - W, S) in place. The buffers are passed at the span the call
 * attends to (KVCache, as the decoder's: GroupQueryAttention reads the first S positions whatever the buffer's
 * length), since the bindings copy every output back, these included.
 */
export class OrtFeatureGraph implements FeatureGraph {
  readonly capacity: number;
  readonly hiddenSize: number;
  readonly topK: number;
  private readonly route = new OutputRoute();
  private readonly kv: KVCache;

  constructor(readonly session: DecoderSession) {
    if (session.featureSession === null) throw new Error('the session was opened without the feature drafter (feature: true)');
    const { layout } = session;
    this.kv = new KVCache(session.ort, session.manifest.kv_dtype, [session.arena.view('drafter_kv.0'), session.arena.view('drafter_kv.1')],
      layout.numKvHeads, layout.headDim, layout.drafterCapacity!);
    this.capacity = session.featureCapacity;
    this.hiddenSize = session.layout.hiddenSize;
    this.topK = session.manifest.feature_drafter!.top_k;
  }

  async run(features: Float32Array, tokens: readonly number[], positions: readonly number[], bias: Float32Array,
    attended: number): Promise<[Float32Array, number[], Float32Array]> {
    const s = this.session;
    const info = s.manifest.feature_drafter!;
    const { ort } = s;
    const h = this.hiddenSize;
    const w = tokens.length;
    const k = this.topK;
    const embeds = new Float32Array(w * h);
    await s.embedding.lookup(BigInt64Array.from(tokens, BigInt), embeds);
    const out = new Float32Array(w * h);
    const ids = new BigInt64Array(w * k);
    const probs = new Float32Array(w * k);
    const kv = this.kv.tensorsFor(attended, attended - w); // the rows before this call's move if the span changes
    const [fIn, eIn, pIn, bIn, kIn, vIn] = info.inputs;
    const [fOut, idsOut, probsOut, kOut, vOut] = info.outputs;
    await this.route.run(s.featureSession!, {
      [fIn]: new ort.Tensor('float32', features.subarray(0, w * h), [1, w, h]),
      [eIn]: new ort.Tensor('float32', embeds, [1, w, h]),
      [pIn]: new ort.Tensor('int64', BigInt64Array.from(positions, BigInt), [1, w]),
      [bIn]: new ort.Tensor('float32', bias, [1, 1, w, attended]),
      [kIn]: kv[0], [vIn]: kv[1],
    }, [
      { name: fOut, tensor: new ort.Tensor('float32', out, [1, w, h]), view: out, poison: NaN },
      { name: idsOut, tensor: new ort.Tensor('int64', ids, [1, w, k]), view: ids, poison: -1n },
      { name: probsOut, tensor: new ort.Tensor('float32', probs, [1, w, k]), view: probs, poison: NaN },
      { name: kOut, tensor: kv[0], view: kv[0].data as View }, // the same buffers: present lands where past was
      { name: vOut, tensor: kv[1], view: kv[1].data as View },
    ]);
    return [out, Array.from(ids, Number), probs];
  }
}

/** The feature drafter of an opened session, drafting as its manifest says (depth, width). */
export function featureDrafter(session: DecoderSession): FeatureDrafter {
  const { depth, width } = featureShape(session.manifest.feature_drafter!);
  return new FeatureDrafter(new OrtFeatureGraph(session), depth, width);
}
