/**
 * The decoder graph (and the Medusa heads graph, and the feature drafter's graph) in ONNX Runtime over one arena
 * (runtime/session.py).
 *
 * Each layer's K and V are arena views [B, H_kv, C, D] wrapped once as tensors and handed to a step as its past
 * input. A step's other inputs and outputs are tensors over arena views with this step's shapes: T tokens'
 * embeddings, positions and the [1, 1, T, S] attention bias over S = past + T positions in; argmax ids and hidden
 * states out (logits when asked).
 *
 * How a step's new K/V rows reach the buffers depends on the graph. The rows graph (the manifest's `rows_graph`,
 * export/rows_graph.py) takes the buffers as inputs only and hands the call's new rows out as one small output,
 * which `KVCache.writeRows` puts at [S - T, S): the JavaScript bindings copy every output back (onnxruntime-node
 * returns a fresh copy of each even when it wrote into the tensor handed to it; onnxruntime-web copies through the
 * WASM heap), so a graph whose presents are outputs costs a copy of the whole attended cache every step. An artifact
 * exported before the rows graph (and an .ort set) runs the decoder itself, each present bound to its past's tensor:
 * onnxruntime-node and onnxruntime-react-native write outputs into the tensors handed to them, so the present lands
 * in the past's buffer as under Python's IOBinding; onnxruntime-web's results are copied into the arena (OutputRoute).
 *
 * Either way the inputs are passed as [1, H_kv, C', D] with C' (the span) the attended length rounded up to
 * SPAN_STEP, laid out inside the layer's fixed [H_kv, C, D] region of the one arena (heads at stride C'·D); when the
 * span changes, the committed rows move to the new stride. GroupQueryAttention attends to the first S positions
 * whatever the buffer's length, so the outputs are those of the full-capacity buffer. A grouped graph reads its K/V
 * whole, as the span L it attends to (runtime/kv_cache.py): there C' is exactly L, relaid whenever L moves by a
 * bucket, as the Python runtime does (tests compare ids with it).
 */

import type * as ortTypes from 'onnxruntime-common';

import { Arena, ArenaLayout, View, layoutFor } from './arena';
import { EmbeddingTable } from './embedding';
import { ArtifactError } from './errors';
import { Manifest, ManifestError, ModelFormat, decoderGraph, embeddingFor, graphDataFiles, graphFile, scratchSlots, span } from './manifest';
import { Sizes } from './sizes';
import { ArtifactSource } from './source';
import { SHARED } from './shared';

export type OrtModule = Pick<typeof ortTypes, 'InferenceSession' | 'Tensor'>;
type Session = ortTypes.InferenceSession;
type Tensor = ortTypes.Tensor;

export interface SessionConfig {
  threads: number; // intra-op threads
  sizes: Sizes; // C, R, T_max as decided (sizes.resolveSizes)
  heads: boolean; // load the Medusa heads graph too
  feature?: boolean; // load the feature drafter's graph too, its KV in the arena
  modelFormat: ModelFormat;
  executionProviders?: string[]; // default: the runtime's CPU provider
  warmUp?: boolean; // default true: run the largest step once at load
}

export interface StepOutput {
  nextTokenIds: BigInt64Array; // [N] greedy next token at each requested row
  hiddenStates: Float32Array; // [T * h]
}

export function sessionOptions(config: SessionConfig, threads: number): ortTypes.InferenceSession.SessionOptions {
  const options: ortTypes.InferenceSession.SessionOptions = {
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
    enableCpuMemArena: true,
    enableMemPattern: false, // the attended length S changes every step
    logSeverityLevel: 3,
    extra: { session: { use_device_allocator_for_initializers: '1' } },
  };
  if (config.executionProviders) options.executionProviders = config.executionProviders;
  return options;
}

async function loadGraph(ort: OrtModule, source: ArtifactSource, file: string, dataFiles: readonly string[],
  options: ortTypes.InferenceSession.SessionOptions): Promise<Session> {
  try {
    const input = await source.graph(file, dataFiles);
    const withData = input.externalData ? { ...options, externalData: input.externalData } : options;
    return typeof input.model === 'string'
      ? await ort.InferenceSession.create(input.model, withData)
      : await ort.InferenceSession.create(input.model, withData);
  } catch (err) {
    const reason = String((err as Error).message ?? err).trim().split('\n')[0].slice(0, 200);
    throw new ArtifactError(`${source.where}/${file} cannot be loaded by ONNX Runtime (${reason}): re-export the artifact, or use an ONNX Runtime >= 1.30`);
  }
}

function checkNames(session: Session, inputs: string[], outputs: string[], where: string): void {
  const missing = [...inputs.filter((n) => !session.inputNames.includes(n)), ...outputs.filter((n) => !session.outputNames.includes(n))];
  if (missing.length) throw new ArtifactError(`${where} does not match its manifest (missing ${JSON.stringify(missing[0])}): re-export the artifact`);
}

/** One output of a run: the tensor handed to the binding over `view`, and a value no real output holds,
 * written into `view` before the first run to see whether the binding writes there. */
interface Output {
  name: string;
  tensor: Tensor;
  view: View;
  poison?: number | bigint; // absent for the KV buffers (they hold committed rows)
}

// errors only, per run: where outputs are copied back (onnxruntime-web), TensorScatter cannot write the KV rows in
// place and warns about its copy on every call through the run's logger, whose default is warnings
const RUN_OPTIONS: ortTypes.InferenceSession.RunOptions = { logSeverityLevel: 3 };

/**
 * How a binding returns outputs, found on a session's first run: onnxruntime-node and
 * onnxruntime-react-native write them into the tensors handed to them (node also returns copies,
 * ignored here); onnxruntime-web copies them through the WASM heap and hands back the caller's
 * tensors unwritten. Where outputs are not written in place, the first run is repeated with the
 * outputs asked for by name (its inputs were not touched) and every run's results are copied into
 * the arena, so callers see one behaviour. `fetched`: outputs asked for by name on every binding
 * (the binding allocates them); `run` returns them.
 */
export class OutputRoute {
  inPlace: boolean | null = null;

  async run(session: Session, feeds: Record<string, Tensor>, outputs: Output[], fetched: readonly string[] = []): Promise<Record<string, Tensor>> {
    if (this.inPlace !== false) {
      const probing = this.inPlace === null;
      if (probing) for (const o of outputs) if (o.poison !== undefined) (o.view as Float32Array).fill(o.poison as number);
      const fetches = { ...Object.fromEntries(outputs.map((o) => [o.name, o.tensor])), ...Object.fromEntries(fetched.map((name) => [name, null])) };
      const results = await session.run(feeds, fetches, RUN_OPTIONS);
      if (probing) {
        this.inPlace = outputs.every((o) => o.poison === undefined || !o.view.some((x: number | bigint) => Object.is(x, o.poison)));
      }
      if (this.inPlace) return results;
    }
    const results = await session.run(feeds, [...outputs.map((o) => o.name), ...fetched], RUN_OPTIONS);
    for (const o of outputs) (o.view as Float32Array).set(results[o.name].data as Float32Array);
    return results;
  }
}

export const SPAN_STEP = SHARED.span_step; // positions: the granularity of the span C' passed to the graph
const WARM_UP_SPANS = 4; // the warm-up attends to this many spans (or R rows, if more)

/** 2L regions of [H_kv, C, D] elements; each holds its heads at stride span·D (see module doc). */
export class KVCache {
  length = 0; // committed positions
  span: number; // C': positions per head as laid out now, <= capacity
  private tensors: Tensor[] = [];

  constructor(readonly ort: OrtModule, readonly dtype: string, readonly views: View[], readonly numKvHeads: number,
    readonly headDim: number, readonly capacity: number, readonly exactSpan = false) {
    this.span = capacity;
    this.makeTensors();
  }

  private makeTensors(): void {
    const dims = [1, this.numKvHeads, this.span, this.headDim];
    const count = this.numKvHeads * this.span * this.headDim;
    this.tensors = this.views.map((v) => new this.ort.Tensor(this.dtype as 'float16', v.subarray(0, count) as Uint16Array, dims));
  }

  /** The past/present tensors for a step attending to `attended` positions, re-laid out if the span changes. */
  tensorsFor(attended: number, keep: number): Tensor[] {
    if (this.exactSpan) { // a grouped graph: `attended` is its span L, and the buffer is read as exactly that
      if (attended !== this.span) this.relayout(attended, keep);
      return this.tensors;
    }
    const wanted = Math.min(this.capacity, Math.ceil(attended / SPAN_STEP) * SPAN_STEP);
    if (wanted > this.span || 2 * wanted <= this.span) this.relayout(wanted, keep);
    return this.tensors;
  }

  /** Write a call's `count` new rows, [2·layers, H_kv, count, D] in kv_pairs order (the rows graph's output), at
   * positions [start, start + count) of every buffer. */
  writeRows(rows: View, start: number, count: number): void {
    const d = this.headDim;
    const block = count * d;
    this.views.forEach((view, j) => {
      for (let h = 0; h < this.numKvHeads; h++) {
        const from = (j * this.numKvHeads + h) * block;
        view.set(rows.subarray(from, from + block) as Float32Array & Uint16Array, (h * this.span + start) * d);
      }
    });
  }

  /** Move each head's first `keep` rows from stride span·D to stride `span`·D (memmove order). */
  private relayout(span: number, keep: number): void {
    const old = this.span * this.headDim;
    const next = span * this.headDim;
    const rows = keep * this.headDim;
    const heads = [...Array(this.numKvHeads).keys()];
    const order = next > old ? heads.reverse() : heads; // growing: last head first, so no row is overwritten unread
    for (const view of this.views) {
      for (const h of order) if (h > 0) view.copyWithin(h * next, h * old, h * old + rows);
    }
    this.span = span;
    this.makeTensors();
  }
}

export class DecoderSession {
  readonly layout: ArenaLayout;
  readonly arena: Arena;
  readonly kv: KVCache;
  readonly embedding: EmbeddingTable;
  private readonly route = new OutputRoute(); // how this binding returns the decoder's outputs
  private readonly headsRoute = new OutputRoute();
  private readonly write = new BigInt64Array(1); // a grouped graph's write position

  private constructor(
    readonly ort: OrtModule,
    readonly manifest: Manifest,
    readonly config: SessionConfig,
    readonly session: Session,
    readonly headsSession: Session | null,
    source: ArtifactSource,
    readonly featureSession: Session | null = null,
    readonly kvRows: string | null = null, // the rows graph's output (null: the decoder, its presents bound to the pasts)
  ) {
    this.embedding = new EmbeddingTable(source, embeddingFor(manifest, config.modelFormat));
    const drafter = featureSession !== null ? manifest.feature_drafter : null;
    this.layout = { ...layoutFor(manifest, config.sizes, headsSession !== null),
      drafterCapacity: drafter ? config.sizes.capacity + scratchSlots(drafter) : 0 }; // as runtime/arena.py sizes it
    this.arena = new Arena(this.layout);
    const l = this.layout;
    this.kv = new KVCache(ort, manifest.kv_dtype, this.arena.kv(), l.numKvHeads, l.headDim, l.capacity,
      manifest.attention === 'grouped');
  }

  static async open(ort: OrtModule, source: ArtifactSource, manifest: Manifest, config: SessionConfig): Promise<DecoderSession> {
    const m = manifest;
    const onnxFile = decoderGraph(m, config.modelFormat);
    const rows = onnxFile === m.decoder_file ? null : m.rows_graph;
    const decoderFile = graphFile(m, onnxFile, config.modelFormat);
    const session = await loadGraph(ort, source, decoderFile, graphDataFiles(m, onnxFile, config.modelFormat),
      sessionOptions(config, config.threads));
    const presents = new Set(m.io.kv_pairs.map(([, present]) => present));
    const outputs = rows === null ? m.io.outputs.map((s) => s.name)
      : [...m.io.outputs.map((s) => s.name).filter((name) => !presents.has(name)), rows.kv_rows];
    checkNames(session, m.io.inputs.map((s) => s.name), outputs, `${source.where}/${decoderFile}`);
    let heads: Session | null = null;
    if (config.heads && m.heads !== null) {
      const headsFile = graphFile(m, m.heads.file, config.modelFormat);
      // One thread, on the caller's: the JavaScript bindings give each session its own intra-op pool, and
      // the decoder's worker keeps spinning for a while after its call; a second pool would fight it
      // for the same cores (Python shares one process-wide pool instead, runtime/session.py).
      heads = await loadGraph(ort, source, headsFile, graphDataFiles(m, m.heads.file, config.modelFormat),
        sessionOptions(config, 1));
      checkNames(heads, [m.heads.hidden], [m.heads.token_ids, m.heads.probs], `${source.where}/${headsFile}`);
    }
    let feature: Session | null = null;
    if (config.feature) {
      const info = m.feature_drafter;
      if (info === null) throw new ManifestError(`${source.where} was exported without the feature drafter: re-export with --feature-drafter, or use drafter 'medusa+lookup' or 'lookup'`);
      const file = graphFile(m, info.file, config.modelFormat);
      feature = await loadGraph(ort, source, file, graphDataFiles(m, info.file, config.modelFormat), sessionOptions(config, 1)); // one thread, as the heads
      checkNames(feature, info.inputs, info.outputs, `${source.where}/${file}`);
    }
    const opened = new DecoderSession(ort, m, config, session, heads, source, feature, rows?.kv_rows ?? null);
    if (config.warmUp ?? true) await opened.warmUp();
    return opened;
  }

  get rows(): number {
    return this.layout.rows;
  }

  /** L: the bias's columns for a call attending to `attended` positions (runtime/span.py). */
  span(attended: number): number {
    return span(attended, this.kv.capacity, this.manifest.span_bucket ?? 1);
  }

  get logitRows(): number {
    return this.layout.logitRows;
  }

  /** Steps of 1, 2, 4, ... R rows and one heads call, so ORT's kernels and buffers are set up before the
   * first token. Unlike Python (all C positions), they attend to a few spans only: at C, the bindings'
   * copies of every layer's whole buffer left later steps slower, with stalls. Writes K/V positions no step reads before writing them. */
  private async warmUp(): Promise<void> {
    const attended = this.span(Math.min(this.kv.capacity, Math.max(this.rows, WARM_UP_SPANS * SPAN_STEP)));
    const a = this.arena;
    const sizes = new Set<number>([this.logitRows]);
    for (let s = 1; s < this.rows; s *= 2) sizes.add(s);
    sizes.add(this.rows);
    for (const size of [...sizes].sort((x, y) => x - y).filter((s) => s <= attended)) {
      a.i64('input_ids').fill(0n, 0, size);
      for (let i = 0; i < size; i++) a.i64('position_ids')[i] = BigInt(attended - size + i);
      a.f32('attention_bias').fill(0, 0, size * attended);
      const logitRows = Math.min(this.logitRows, size);
      for (let i = 0; i < logitRows; i++) a.i64('logits_indices')[i] = BigInt(i);
      await this.run(size, attended, logitRows);
    }
    if (this.headsSession !== null) await this.runHeads();
  }

  private tensor(type: 'float32' | 'int64', view: Float32Array | BigInt64Array, dims: number[]): Tensor {
    const count = dims.reduce((x, y) => x * y, 1);
    return new this.ort.Tensor(type, view.subarray(0, count) as Float32Array, dims);
  }

  /**
   * Run T = `size` tokens whose ids, positions, bias rows (T * L, L = span(S), the columns from S on
   * masked) and N logit row indices the caller wrote into the arena. Returns arena views (valid until the next run); writes K/V
   * positions [S - T, S).
   */
  async run(size: number, attended: number, logitRows: number, withLogits = false): Promise<StepOutput> {
    if (size > this.rows || logitRows > this.logitRows) {
      throw new RangeError(`${size} tokens / ${logitRows} logit rows exceed the arena's ${this.rows} / ${this.logitRows}`);
    }
    if (attended > this.kv.capacity) throw new RangeError(`${attended} positions exceed the KV capacity ${this.kv.capacity}`);
    const io = this.manifest.io;
    const a = this.arena;
    const h = this.layout.hiddenSize;
    const embeds = a.f32('inputs_embeds');
    await this.embedding.lookup(a.i64('input_ids').subarray(0, size), embeds);
    const feeds: Record<string, Tensor> = {
      [io.inputs_embeds]: this.tensor('float32', embeds, [1, size, h]),
      [io.position_ids]: this.tensor('int64', a.i64('position_ids'), [1, size]),
      [io.attention_bias]: this.tensor('float32', a.f32('attention_bias'), [1, 1, size, this.span(attended)]),
      [io.logits_indices]: this.tensor('int64', a.i64('logits_indices'), [1, logitRows]),
    };
    if (io.write_position) { // grouped attention: the rows go at S - T, the span is the bias's
      this.write[0] = BigInt(attended - size);
      feeds[io.write_position] = this.tensor('int64', this.write, [1]);
    }
    // Not fetched: logits (greedy acceptance reads next_token_ids; a binding would copy N·V floats a step).
    const outputs: Output[] = [
      { name: io.next_token_ids, tensor: this.tensor('int64', a.i64('next_token_ids'), [1, logitRows]),
        view: a.i64('next_token_ids').subarray(0, logitRows), poison: -1n },
      { name: io.hidden_states, tensor: this.tensor('float32', a.f32('hidden_states'), [1, size, h]),
        view: a.f32('hidden_states').subarray(0, size * h), poison: NaN },
    ];
    if (withLogits) { // the route probe compares them (routeProbe.ts)
      const v = this.layout.vocabSize;
      outputs.push({ name: io.logits, tensor: this.tensor('float32', a.f32('logits'), [1, logitRows, v]),
        view: a.f32('logits').subarray(0, logitRows * v), poison: NaN });
    }
    const kv = this.kv.tensorsFor(this.span(attended), attended - size);
    io.kv_pairs.forEach(([past, present], i) => {
      feeds[past] = kv[i];
      if (this.kvRows === null) outputs.push({ name: present, tensor: kv[i], view: kv[i].data as View }); // present lands where past was
    });
    const fetched = this.kvRows === null ? [] : [this.kvRows];
    const results = await this.route.run(this.session, feeds, outputs, fetched);
    if (this.kvRows !== null) this.kv.writeRows(results[this.kvRows].data as View, attended - size, size);
    return {
      nextTokenIds: a.i64('next_token_ids').subarray(0, logitRows),
      hiddenStates: a.f32('hidden_states').subarray(0, size * h),
    };
  }

  /** The heads graph on the arena's heads_hidden row → [K * k] ids and probabilities (arena views). */
  async runHeads(): Promise<[BigInt64Array, Float32Array]> {
    const info = this.manifest.heads!;
    const a = this.arena;
    const l = this.layout;
    const dims = [1, l.numHeads, l.topK];
    const ids = a.i64('heads_token_ids');
    const probs = a.f32('heads_probs');
    await this.headsRoute.run(this.headsSession!, { [info.hidden]: this.tensor('float32', a.f32('heads_hidden'), [1, l.hiddenSize]) }, [
      { name: info.token_ids, tensor: this.tensor('int64', ids, dims), view: ids, poison: -1n },
      { name: info.probs, tensor: this.tensor('float32', probs, dims), view: probs, poison: NaN },
    ]);
    return [ids, probs];
  }

  /** KV slots the feature drafter may use: its arena rows, within what its graph's rotary covers. */
  get featureCapacity(): number {
    return Math.min(this.layout.drafterCapacity ?? 0, this.manifest.feature_drafter?.capacity ?? 0);
  }

  commit(count: number): void {
    if (this.kv.length + count > this.kv.capacity) throw new RangeError(`committing ${count} positions overflows the KV capacity ${this.kv.capacity}`);
    this.kv.length += count;
  }

  /** Copy KV positions `sources` (absolute, ascending, each >= its target) to start, start+1, ... in every layer: the tree commit. */
  movePositions(sources: readonly number[], start: number): void {
    const { numKvHeads, headDim } = this.layout;
    const span = this.kv.span;
    sources.forEach((source, i) => {
      const target = start + i;
      if (source === target) return;
      for (const view of this.kv.views) {
        for (let head = 0; head < numKvHeads; head++) {
          const base = head * span * headDim;
          view.copyWithin(base + target * headDim, base + source * headDim, base + (source + 1) * headDim);
        }
      }
    });
  }

  /** Forget committed positions from `length` on. */
  rewind(length: number): void {
    this.kv.length = Math.min(length, this.kv.length);
  }

  async close(): Promise<void> {
    await this.session.release();
    if (this.headsSession !== null) await this.headsSession.release();
    if (this.featureSession !== null) await this.featureSession.release();
  }
}
