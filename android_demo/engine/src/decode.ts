/**
 * The generate loop as small named steps over a backend (runtime/decode.py):
 *
 *   prefill → [draft → choose → verify → accept → commit] ...
 *
 *   prefill – the prompt as one causal chunk; yields the first token (the next root);
 *   draft   – the drafter proposes a scored token tree under the root;
 *   choose  – the width policy verifies a prefix of it (the controller prices each T);
 *   verify  – one decoder call over the T tree nodes;
 *   accept  – walk down from the root while some child carries the base model's argmax after its
 *             parent; the argmax after the last accepted node is the next root;
 *   commit  – keep the accepted nodes' K/V positions, contiguous after the committed ones.
 *
 * Plain greedy decoding is the same loop with one-node trees. Greedy speculative output is token-
 * identical to plain greedy whatever the drafter proposes: every emitted token is the base model's
 * argmax after its prefix. A `Reply` carries one reply from step to step (first → [propose → verify →
 * accept → commit → advance → emit]), as runtime/decode.py's does. Under a constraint (constraint.ts) every
 * row's choice is the argmax among the tokens the grammar allows, drafted nodes it forbids are pruned before the
 * call, and tokens it forces are decided without a step of their own (the next call runs them as a chain), so
 * constrained output is constrained greedy's either way. With a `Sampling` (sampling.ts) every choice is instead
 * the position's seeded draw from the base model's distribution (a drafted child kept where it is that draw), so a
 * sampled reply is plain sampling's with the same seed, and the Python runtime's. Logit rules are Python's alone.
 */

import { Forward, OrtBackend } from './backend';
import { Matcher, NO_TOKEN, chooseMasked } from './constraint';
import { DraftTree, Drafter } from './drafters/draft';
import { Sampling, acceptSampled, sampleNext } from './sampling';
import { chain } from './tree';

export interface WidthPolicy {
  budget(spaceLeft: number): number; // nodes to draft this step; 1: a plain step
  choose(draft: DraftTree, draftMs: number): number; // T to verify, 1 <= T <= draft.size
  observe(draft: DraftTree, size: number, path: readonly number[]): void;
}

/** The default policy: draft up to T_max nodes (cut to the KV positions left), verify them all. */
export class FullWidth implements WidthPolicy {
  constructor(readonly maxSize: number) {}
  budget(spaceLeft: number): number {
    return Math.max(1, Math.min(this.maxSize, spaceLeft));
  }
  choose(draft: DraftTree): number {
    return draft.size;
  }
  observe(): void {}
}

export interface GenerationStats {
  promptTokens: number;
  newTokens: number;
  steps: number; // decoder calls after prefill, + 1 for the prefill
  prefillMs: number; // time to first token
  decodeMs: number;
  finishReason: string; // eos | length | capacity | interrupted | constraint (the grammar allowed no token)
  acceptLengths: number[]; // tokens gained per verify step
  treeSizes: number[]; // T verified per step
  draftSizes: number[];
  draftMs: number;
  kvUsed: number[]; // committed KV positions after each step
  decodeTokensPerS: number;
  meanAccepted: number;
  forcedTokens: number; // tokens a constraint forced (decided without a model step of their own)
  prunedNodes: number; // drafted nodes a constraint forbade (cut before the verify)
}

export interface Generation {
  tokenIds: number[]; // generated ids, the stop token included
  stats: GenerationStats;
}

export interface Step {
  root: number; // the next token, already decided by the base model
  hidden: Float32Array; // [h] hidden state of the last committed position
  rows?: Float32Array; // [T·h] the call's hidden states (arena views, valid until the next call)
  path?: readonly number[]; // the nodes committed from them (absent: every row)
}

/** The prompt as one causal chain, committed; the call's output (its last position's row last). */
export async function runPrompt(backend: OrtBackend, prompt: readonly number[]): Promise<Forward> {
  const out = await backend.forward(prompt, chain(prompt.length), true);
  backend.commit(prompt.map((_, i) => i));
  return out;
}

/** Greedy: run the prompt; the first token and the last hidden state. */
export async function prefill(backend: OrtBackend, prompt: readonly number[]): Promise<Step> {
  return lastStep(await runPrompt(backend, prompt), backend.hiddenSize);
}

/** The prompt's last position: its next token and hidden state (a last-only call has one token row and every
 * position's hidden state). */
function lastStep(out: Forward, hiddenSize: number): Step {
  const rows = out.hiddenStates.length / hiddenSize;
  return { root: out.nextTokenIds[out.nextTokenIds.length - 1], hidden: out.hiddenStates.subarray((rows - 1) * hiddenSize, rows * hiddenSize),
    rows: out.hiddenStates };
}

function stepAt(out: Forward, node: number, hiddenSize: number, path?: readonly number[]): Step {
  return { root: out.nextTokenIds[node], hidden: out.hiddenStates.subarray(node * hiddenSize, (node + 1) * hiddenSize), rows: out.hiddenStates, path };
}

/** The longest root-to-node path whose every node is the base model's argmax after its parent. */
export function accept(tokens: readonly number[], parents: readonly number[], nextIds: readonly number[]): number[] {
  const path = [0];
  for (;;) {
    const want = nextIds[path[path.length - 1]];
    const child = parents.findIndex((p, i) => p === path[path.length - 1] && tokens[i] === want);
    if (child < 0) return path;
    path.push(child);
  }
}

/** verify → accept → commit: the accepted node indices (root first) and the next step. */
export async function verifyAndCommit(backend: OrtBackend, tokens: readonly number[], parents: readonly number[]): Promise<[number[], Step]> {
  const out = await backend.forward(tokens, parents);
  const path = accept(tokens, parents, out.nextTokenIds);
  const step = stepAt(out, path[path.length - 1], backend.hiddenSize, path);
  backend.commit(path);
  return [path, step];
}

export interface GenerateOptions {
  maxNewTokens: number;
  eosTokenIds: ReadonlySet<number>;
  drafter?: Drafter | null;
  maxTree?: number; // T_max
  history?: readonly number[]; // tokens committed before `prompt` (earlier turns), for drafters
  onToken?: (id: number) => void;
  policy?: WidthPolicy | null;
  chainsOnly?: boolean; // verify only the draft's best path (manifest.draft_shape "chain")
  signal?: AbortSignal; // stop between steps; what was emitted stays
  constraint?: Matcher | null; // a fresh matcher the reply must satisfy (constraint.ts); the backend fetches logits
  sampling?: Sampling | null; // null: greedy; else seeded draws (sampling.ts); the backend fetches logits
}

function newStats(promptTokens: number): GenerationStats {
  return {
    promptTokens, newTokens: 0, steps: 0, prefillMs: 0, decodeMs: 0, finishReason: '', acceptLengths: [], treeSizes: [],
    draftSizes: [], draftMs: 0, kvUsed: [], decodeTokensPerS: 0, meanAccepted: 0, forcedTokens: 0, prunedNodes: 0,
  };
}

/**
 * A step's tree as the call runs it, and the time its draft took; under a constraint its first `decided` nodes are
 * the root and the tokens the grammar forced after it, and `masks` the allowed tokens after each node.
 */
export interface Verify {
  tree: DraftTree;
  draftMs: number;
  decided?: number;
  masks?: Map<number, Uint8Array>;
}

/**
 * One reply being decoded: what the loop carries from one step to the next (runtime/decode.py's Reply,
 * step for step): first, propose, (the decoder call), accept, (the commit), advance, emit.
 */
export class Reply {
  readonly generation: Generation;
  readonly context: number[]; // every decided token: the drafters read it
  step: Step | null = null; // the last call's root and hidden state
  forced: number[] = []; // tokens a grammar forced after the root, not yet run
  private readonly started = performance.now();
  private readonly constraint: Matcher | null;
  private readonly sampling: Sampling | null;
  private readonly start: number; // context tokens before the reply's first

  constructor(prompt: readonly number[], private readonly options: GenerateOptions, private readonly drafter: Drafter | null) {
    this.generation = { tokenIds: [], stats: newStats(prompt.length) };
    this.context = [...(options.history ?? []), ...prompt];
    this.start = this.context.length;
    this.constraint = options.constraint ?? null;
    this.sampling = options.sampling ?? null;
  }

  /** The reply position of the next token to decide (sampling's draws are numbered by it). */
  get position(): number {
    return this.context.length - this.start;
  }

  /** The token after row `row` of a call: the grammar's (argmax or draw among what it allows), a draw, or the
   * graph's argmax. */
  private pick(out: Forward, row: number, allowed: Uint8Array | null, position: number, context: readonly number[]): number {
    if (this.sampling === null) return allowed === null ? out.nextTokenIds[row] : chooseMasked(logitsOf(out), row, allowed);
    const logits = rowOf(out, row);
    return allowed === null ? sampleNext(logits, this.sampling, position, context) : sampleMasked(logits, allowed, this.sampling, position, context);
  }

  /** After the prompt's last chunk: the first token, and the tokens a grammar forces after it (up to `room`). */
  async first(out: Forward, hiddenSize: number, room = Infinity): Promise<number[]> {
    const last = out.nextTokenIds.length - 1;
    this.step = lastStep(out, hiddenSize);
    const allowed = this.constraint === null ? null : await this.constraint.mask();
    if (allowed !== null || this.sampling !== null) this.step = { ...this.step, root: this.pick(out, last, allowed, 0, this.context) };
    this.generation.stats.prefillMs = performance.now() - this.started;
    this.generation.stats.steps = 1;
    return this.decide([this.step.root], room);
  }

  /**
   * The step's tree of at most `budget` nodes: the drafter's (past the forced chain, where it reads tokens alone) or
   * the root alone, then a constraint's pruning and its decided chain (the root, then the tokens the grammar forced).
   */
  async propose(budget: number): Promise<Verify> {
    const root = this.context[this.context.length - 1];
    budget -= this.forced.length;
    let draft = DraftTree.rootOnly(root);
    let draftMs = 0;
    if (budget > 1 && this.drafter !== null && this.step !== null) {
      const drafting = performance.now();
      const { hidden, rows, path } = this.step;
      draft = await this.drafter.propose({ tokens: this.context, hidden, rows, path, ahead: this.forced.length }, budget);
      if (this.options.chainsOnly) draft = draft.bestPath();
      draftMs = performance.now() - drafting;
    }
    const c = this.constraint;
    if (c === null) return { tree: draft, draftMs };
    const [kept, masks] = await c.along(draft);
    this.generation.stats.prunedNodes += draft.size - kept.length;
    const decided = [this.step!.root, ...this.forced];
    const last = decided.length - 1;
    const tree = last > 0 ? DraftTree.chain(decided).graft(draft.keep(kept)) : draft.keep(kept);
    return { tree, draftMs, decided: decided.length, masks: new Map(kept.map((old, i) => [last + i, masks.get(old)!])) };
  }

  /** The accepted nodes (root first) of the verified tree and the step it leads to. */
  accept(verify: Verify, out: Forward, hiddenSize: number): [number[], Step] {
    const tree = verify.tree;
    const decided = verify.decided ?? 1;
    const after = this.position - decided + 1; // the reply position that follows the tree's node 0
    const ending = (path: number[], root: number): [number[], Step] => [path, { ...stepAt(out, path[path.length - 1], hiddenSize, path), root }];
    if (this.constraint === null || verify.masks === undefined) {
      if (this.sampling === null) {
        const path = accept(tree.tokens, tree.parents, out.nextTokenIds);
        return [path, stepAt(out, path[path.length - 1], hiddenSize, path)];
      }
      return ending(...acceptSampled(tree.tokens, tree.parents, logitsOf(out), vocabOf(out), this.sampling, after, this.context));
    }
    const masks = verify.masks;
    if (this.sampling !== null && tree.size > decided) return ending(...this.acceptMaskedDraws(verify, out, after));
    const path = Array.from({ length: decided }, (_, i) => i); // the decided chain, whatever the model says
    for (;;) {
      const node = path[path.length - 1];
      const want = this.pick(out, node, masks.get(node)!, after + node, this.context);
      const child = tree.parents.findIndex((p, i) => i > node && p === node && tree.tokens[i] === want);
      if (child < 0 || this.sampling !== null) return ending(path, want);
      path.push(child);
    }
  }

  /** Sampled acceptance under a constraint (runtime/constraint.py accept_constrained): the drafted subtree under the
   * decided chain's last node, accepted on the masked rows (a node where the grammar is complete keeps its row). */
  private acceptMaskedDraws(verify: Verify, out: Forward, after: number): [number[], number] {
    const tree = verify.tree;
    const masks = verify.masks!;
    const last = (verify.decided ?? 1) - 1;
    const chain = Array.from({ length: last }, (_, i) => i);
    if (!masks.get(last)!.includes(1)) return [[...chain, last], NO_TOKEN];
    const vocab = vocabOf(out);
    const rows = new Float32Array((tree.size - last) * vocab);
    for (let i = last; i < tree.size; i++) {
      const allowed = masks.get(i)!;
      rows.set(allowed.includes(1) ? masked(rowOf(out, i), allowed) : rowOf(out, i), (i - last) * vocab);
    }
    const parents = [-1, ...tree.parents.slice(last + 1).map((p) => p - last)];
    const [sub, root] = acceptSampled(tree.tokens.slice(last), parents, rows, vocab, this.sampling!, after + last, this.context);
    const path = [...chain, ...sub.map((i) => last + i)];
    return [path, masks.get(path[path.length - 1])!.includes(1) ? root : NO_TOKEN];
  }

  /** After the commit: the step's decided tokens (the accepted drafts, the next root, what a grammar forces after
   * it: up to `room`) and its stats. */
  async advance(verify: Verify, path: readonly number[], next: Step, drafted: number, length: number,
    room = Infinity): Promise<number[]> {
    this.step = next;
    const stats = this.generation.stats;
    stats.steps += 1;
    stats.draftMs += verify.draftMs;
    stats.draftSizes.push(drafted);
    stats.treeSizes.push(verify.tree.size);
    stats.acceptLengths.push(path.length);
    stats.kvUsed.push(length);
    return this.decide([...path.slice(verify.decided ?? 1).map((i) => verify.tree.tokens[i]), next.root], room);
  }

  private async decide(tokens: number[], room: number): Promise<number[]> {
    const c = this.constraint;
    if (c !== null) {
      const real = tokens.filter((t) => t !== NO_TOKEN);
      c.consume(real);
      this.forced = c.done || real.length < tokens.length ? [] : (await c.forced()).slice(0, Math.max(0, room));
      c.consume(this.forced);
      this.generation.stats.forcedTokens += this.forced.length;
      tokens = [...real, ...this.forced];
    }
    this.context.push(...tokens);
    return tokens;
  }

  /** Hand `tokens` on up to a stop token or the length limit; the finish reason, or '' while the reply goes on. */
  emit(tokens: readonly number[], full: boolean): string {
    const ids = this.generation.tokenIds;
    for (const token of tokens) {
      ids.push(token);
      this.options.onToken?.(token);
      if (this.options.eosTokenIds.has(token)) return this.finish('eos');
      if (ids.length >= this.options.maxNewTokens) return this.finish('length');
    }
    if (this.options.signal?.aborted) return this.finish('interrupted');
    const c = this.constraint;
    if (c !== null && (c.done || this.step?.root === NO_TOKEN)) return this.finish(c.done ? 'eos' : 'constraint');
    return full ? this.finish('capacity') : '';
  }

  private finish(reason: string): string {
    const stats = this.generation.stats;
    stats.finishReason = reason;
    stats.newTokens = this.generation.tokenIds.length;
    stats.decodeMs = performance.now() - this.started - stats.prefillMs;
    stats.decodeTokensPerS = stats.decodeMs > 0 && stats.newTokens > 1 ? (stats.newTokens - 1) / (stats.decodeMs / 1e3) : 0;
    stats.meanAccepted = stats.acceptLengths.length ? stats.acceptLengths.reduce((a, b) => a + b, 0) / stats.acceptLengths.length : 0;
    return reason;
  }
}

/** Greedy decoding on top of what the backend has committed; speculative with a drafter and maxTree > 1. */
export async function generate(backend: OrtBackend, prompt: readonly number[], options: GenerateOptions): Promise<Generation> {
  const maxTree = options.maxTree ?? 1;
  const speculative = (options.drafter ?? null) !== null && maxTree > 1;
  const policy = speculative && options.policy ? options.policy : new FullWidth(speculative ? maxTree : 1);
  const reply = new Reply(prompt, options, speculative ? options.drafter ?? null : null);
  const h = backend.hiddenSize;
  const fetched = backend.withLogits;
  // a grammar and a sampler choose from the logits
  backend.withLogits = fetched || (options.constraint ?? null) !== null || (options.sampling ?? null) !== null;
  try {
    let decided = await reply.first(await runPrompt(backend, prompt), h, room(backend));
    while (!reply.emit(decided, backend.length >= backend.capacity)) {
      const verify = await reply.propose(policy.budget(backend.capacity - backend.length));
      const size = Math.max(verify.decided ?? 1, policy.choose(verify.tree, verify.draftMs));
      const verified = { ...verify, tree: verify.tree.prefix(size) };
      const out = await backend.forward(verified.tree.tokens, verified.tree.parents);
      const [path, next] = reply.accept(verified, out, h);
      backend.commit(path);
      policy.observe(verify.tree, verified.tree.size, path);
      decided = await reply.advance(verified, path, next, verify.tree.size, backend.length, room(backend));
    }
  } finally {
    backend.withLogits = fetched;
  }
  return reply.generation;
}

/** KV positions left after the next root for the tokens a grammar forces (the chain that runs them). */
function room(backend: OrtBackend): number {
  return backend.capacity - backend.length - 1 - backend.padding;
}

function logitsOf(out: Forward): Float32Array {
  if (out.logits === undefined) throw new Error('a constrained or sampled reply needs the logits: the backend fetches them (withLogits)');
  return out.logits;
}

function vocabOf(out: Forward): number {
  return logitsOf(out).length / out.nextTokenIds.length;
}

function rowOf(out: Forward, row: number): Float32Array {
  const vocab = vocabOf(out);
  return logitsOf(out).subarray(row * vocab, (row + 1) * vocab);
}

/** A row's logits with the tokens a grammar forbids at -Infinity (a copy). */
function masked(row: Float32Array, allowed: Uint8Array): Float32Array {
  const out = Float32Array.from(row);
  for (let t = 0; t < out.length; t++) if (!allowed[t]) out[t] = -Infinity;
  return out;
}

/** A draw among the tokens a grammar allows (NO_TOKEN where it allows none). */
function sampleMasked(row: Float32Array, allowed: Uint8Array, sampling: Sampling, position: number, context: readonly number[]): number {
  return allowed.includes(1) ? sampleNext(masked(row, allowed), sampling, position, context) : NO_TOKEN;
}
