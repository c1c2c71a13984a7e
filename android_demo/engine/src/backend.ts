/**
 * The backend the decode loop runs on (runtime/runner.py: StepRunner runs the steps, OrtBackend is its row 0): a KV
 * buffer of `capacity` positions, `length` committed. `forward` runs T new tokens laid out as a tree on top of the
 * committed positions; `commit` keeps a root-to-node path of them; `rewind` forgets positions.
 *
 * One numeric route (runtime/row_route.py): every call runs at least `route.minRows` rows, a multiple of
 * `route.multiple`, and gathers as many LM-head rows; a 1-token step gets padding rows (the same token again, as a
 * chain under it) whose outputs are ignored. ONNX Runtime's CPU kernels may take another path for a single row (x86)
 * or compute rows in tiles (aarch64), so without it a row computed alone could differ from the same row inside a
 * tree verify. The route is the CPU's business: the Python runtime probes it per machine; here it is the manifest's
 * unless the app passes the device's (EngineOptions.route). Padding rows cost KV positions: `capacity` is the
 * buffer's less them.
 */

import { ConfigError, ContextOverflowError } from './errors';
import { RowRoute, manifestRoute } from './manifest';
import { DecoderSession } from './session';
import { chain, depths, treeBias } from './tree';
import { SHARED } from './shared';

const TREE_CACHE = SHARED.tree_cache; // tree shapes whose depths and bias stay cached

export interface Forward {
  nextTokenIds: number[]; // [N] greedy next token after each node (N = T, or 1 with lastOnly)
  hiddenStates: Float32Array; // [T * h] (an arena view, valid until the next forward)
  logits?: Float32Array; // [N * V], a copy, when the backend fetches them (withLogits: the route probe)
}

export function checkFits(length: number, added: number, capacity: number, reserved = 0): void {
  if (length + added > capacity) {
    const kept = reserved ? ` (${capacity} for tokens, ${reserved} for a padding row)` : '';
    throw new ContextOverflowError(`${length} cached + ${added} new tokens exceed the KV capacity of ${capacity + reserved}${kept}: shorten the input or use a larger capacity`);
  }
}

/** Rows a call of `real` rows runs (runtime/row_route.py RowRoute.rows_for): at least `minRows`, rounded up to `multiple`,
 * never more than `most`. */
export function routeRowsFor(real: number, minRows: number, multiple: number, most: number): number {
  let rows = Math.max(real, minRows);
  rows += (multiple - (rows % multiple)) % multiple;
  return Math.min(rows, Math.max(real, most));
}

/** A route from "4x4" (rows at least x a multiple of), as `specmemo plan` and `bench arm` print it. */
export function parseRoute(text: string): RowRoute {
  const match = /^(\d+)x([124])$/.exec(text);
  if (match === null || Number(match[1]) < 1) {
    throw new ConfigError(`route ${JSON.stringify(text)} is not rows x multiple (e.g. 2x1, 4x4; the multiple 1, 2 or 4)`);
  }
  return { minRows: Number(match[1]), multiple: Number(match[2]) };
}

/** One row's part of a call (runtime/runner.py RowCall): its tokens as a tree on top of its committed positions and
 * `after` uncommitted ones its earlier calls wrote (a prompt run in chunks). */
export interface RowCall {
  row: number;
  tokens: readonly number[];
  parents: readonly number[];
  lastOnly?: boolean;
  after?: number;
}

/** Decoder steps of one session (runtime/runner.py StepRunner): `forward` lays out a step's row calls for the graph and
 * runs one call, `commit` keeps a row's accepted nodes. The device engine opens the one-sequence graph: row 0. The
 * route's padding rows follow a call's last node, and the LM head's rows the same rule. */
export class StepRunner {
  readonly minRows: number;
  readonly rowMultiple: number;
  readonly padding: number; // the most padding rows a call adds
  withLogits = false; // fetch the logits too (a copy of N·V floats a call: the route probe and grammars only)
  private readonly treeInputs = new Map<string, [number[], Float32Array]>();

  constructor(readonly session: DecoderSession, route: RowRoute = manifestRoute(session.manifest)) {
    this.minRows = Math.min(route.minRows, session.rows);
    this.rowMultiple = session.rows > 1 ? route.multiple : 1;
    this.padding = Math.max(this.minRows, this.rowMultiple) - 1;
  }

  get capacity(): number { // per row, less the padding rows' positions
    return this.session.kv.capacity - this.padding;
  }

  /** One decoder call: here one call, on row 0. Returns its outputs by row. */
  async forward(calls: readonly RowCall[]): Promise<Map<number, Forward>> {
    if (calls.length !== 1 || calls[0].row !== 0) {
      throw new RangeError(`a one-sequence session runs one call, on row 0: got rows ${calls.map((c) => c.row).join(', ')}`);
    }
    const call = calls[0];
    return new Map([[0, await this.one(call.tokens, call.parents, call.after ?? 0, call.lastOnly ?? false)]]);
  }

  private tree(parents: readonly number[]): [number[], Float32Array] {
    const key = parents.join(',');
    let cached = this.treeInputs.get(key);
    if (cached === undefined) {
      if (this.treeInputs.size >= TREE_CACHE) this.treeInputs.clear();
      cached = [depths(parents), treeBias(parents)];
      this.treeInputs.set(key, cached);
    }
    return cached;
  }

  /** The one-sequence graph's call for `tokens` on top of the committed positions and `offset` uncommitted ones. */
  private async one(tokens: readonly number[], parents: readonly number[], offset: number, lastOnly: boolean): Promise<Forward> {
    const real = tokens.length;
    const rows = routeRowsFor(real, this.minRows, this.rowMultiple, this.session.rows);
    if (real < rows) { // padding rows: a chain under the last node, never read
      tokens = [...tokens, ...new Array<number>(rows - real).fill(tokens[real - 1])];
      parents = [...parents, ...Array.from({ length: rows - real }, (_, i) => real - 1 + i)];
    }
    const a = this.session.arena;
    const size = tokens.length;
    const past = this.session.kv.length + offset;
    const attended = past + size;
    const [depth, block] = this.tree(parents);
    const ids = a.i64('input_ids');
    const positions = a.i64('position_ids');
    for (let i = 0; i < size; i++) {
      ids[i] = BigInt(tokens[i]);
      positions[i] = BigInt(past + depth[i]);
    }
    const bias = a.f32('attention_bias');
    const columns = this.session.span(attended); // a grouped graph's span past S is masked (runtime/span.py)
    for (let i = 0; i < size; i++) {
      bias.fill(0, i * columns, i * columns + past);
      bias.set(block.subarray(i * size, (i + 1) * size), i * columns + past);
      bias.fill(-Infinity, i * columns + attended, (i + 1) * columns);
    }
    const wanted = lastOnly ? 1 : real; // logit rows asked for: the last node's, or every node's
    const first = real - wanted;
    // the LM head's rows on the same route
    const gathered = routeRowsFor(wanted, Math.min(this.minRows, size), this.rowMultiple, Math.min(size, this.session.logitRows));
    const start = Math.min(first, size - gathered); // gathered rows [start, start + gathered) hold the wanted ones
    const indices = a.i64('logits_indices');
    for (let i = 0; i < gathered; i++) indices[i] = BigInt(start + i);
    const out = await this.session.run(size, attended, gathered, this.withLogits);
    const at = first - start;
    const h = this.session.layout.hiddenSize;
    const v = this.session.layout.vocabSize;
    return {
      nextTokenIds: Array.from(out.nextTokenIds.subarray(at, at + wanted), Number),
      hiddenStates: out.hiddenStates.subarray(0, real * h),
      ...(this.withLogits ? { logits: a.f32('logits').slice(at * v, (at + wanted) * v) } : {}),
    };
  }

  /** Keep `nodes` (indices into the row's last call, root first) as its next committed positions. */
  commit(row: number, nodes: readonly number[]): void {
    if (row !== 0) throw new RangeError(`a one-sequence session has row 0 only, not ${row}`);
    const start = this.session.kv.length;
    const sources = nodes.map((node) => start + node);
    if (sources.some((source, i) => source !== start + i)) this.session.movePositions(sources, start);
    this.session.commit(sources.length);
  }
}

/** One sequence, row 0 of a StepRunner (runtime/runner.py OrtBackend), behind the interface the decode loop, the
 * controller and the drafters run on: a prompt longer than the arena's rows runs in chunks of R rows. */
export class OrtBackend {
  readonly runner: StepRunner;

  constructor(readonly session: DecoderSession, route: RowRoute = manifestRoute(session.manifest)) {
    this.runner = new StepRunner(session, route);
  }

  get minRows(): number {
    return this.runner.minRows;
  }

  get rowMultiple(): number {
    return this.runner.rowMultiple;
  }

  get padding(): number {
    return this.runner.padding;
  }

  get withLogits(): boolean {
    return this.runner.withLogits;
  }

  set withLogits(fetch: boolean) {
    this.runner.withLogits = fetch;
  }

  get capacity(): number {
    return this.runner.capacity;
  }

  get length(): number {
    return this.session.kv.length;
  }

  get hiddenSize(): number {
    return this.session.layout.hiddenSize;
  }

  /** Next tokens for every node, or with `lastOnly` for the last one (prefill, chunked by R rows). */
  async forward(tokens: readonly number[], parents: readonly number[], lastOnly = false): Promise<Forward> {
    checkFits(this.length, tokens.length, this.capacity, this.padding);
    const s = this.session;
    const size = tokens.length;
    const run = async (part: readonly number[], tree: readonly number[], after: number): Promise<Forward> =>
      (await this.runner.forward([{ row: 0, tokens: part, parents: tree, lastOnly, after }])).get(0)!;
    if (size <= s.rows && (lastOnly || size <= s.logitRows)) return run(tokens, parents, 0);
    if (parents.some((p, i) => p !== i - 1)) {
      throw new RangeError(`a tree of ${size} nodes exceeds the arena's T_max of ${s.logitRows}: open the engine with larger sizes`);
    }
    const chunk = lastOnly ? s.rows : s.logitRows;
    const ids: number[] = [];
    const hidden: Float32Array[] = [];
    const logits: Float32Array[] = [];
    let out: Forward | null = null;
    for (let start = 0; start < size; start += chunk) {
      const part = tokens.slice(start, start + chunk);
      out = await run(part, chain(part.length), start);
      if (!lastOnly) {
        ids.push(...out.nextTokenIds);
        hidden.push(out.hiddenStates.slice());
        if (out.logits !== undefined) logits.push(out.logits);
      }
    }
    if (lastOnly) return out!;
    return { nextTokenIds: ids, hiddenStates: concat(hidden), ...(this.withLogits ? { logits: concat(logits) } : {}) };
  }

  /** Keep `nodes` (indices into the last forward, root first) as the next committed positions. */
  commit(nodes: readonly number[]): void {
    this.runner.commit(0, nodes);
  }

  rewind(length: number): void {
    this.session.rewind(length);
  }

  reset(): void {
    this.session.rewind(0);
  }
}

function concat(parts: readonly Float32Array[]): Float32Array {
  const all = new Float32Array(parts.reduce((n, x) => n + x.length, 0));
  parts.reduce((at, x) => { all.set(x, at); return at + x.length; }, 0);
  return all;
}
