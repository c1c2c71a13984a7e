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
 * argmax after its prefix. (Typical-acceptance sampling is Python-only for now.)
 */

import { OrtBackend } from './backend';
import { DraftTree, Drafter } from './drafters/draft';
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
  finishReason: string; // eos | length | capacity | interrupted
  acceptLengths: number[]; // tokens gained per verify step
  treeSizes: number[]; // T verified per step
  draftSizes: number[];
  draftMs: number;
  kvUsed: number[]; // committed KV positions after each step
  decodeTokensPerS: number;
  meanAccepted: number;
}

export interface Generation {
  tokenIds: number[]; // generated ids, the stop token included
  stats: GenerationStats;
}

export interface Step {
  root: number; // the next token, already decided by the base model
  hidden: Float32Array; // [h] hidden state of the last committed position
}

export async function prefill(backend: OrtBackend, prompt: readonly number[]): Promise<Step> {
  const out = await backend.forward(prompt, chain(prompt.length), true);
  backend.commit(prompt.map((_, i) => i));
  const h = backend.hiddenSize;
  const rows = out.hiddenStates.length / h;
  return { root: out.nextTokenIds[out.nextTokenIds.length - 1], hidden: out.hiddenStates.subarray((rows - 1) * h, rows * h) };
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
  const last = path[path.length - 1];
  const h = backend.hiddenSize;
  const step = { root: out.nextTokenIds[last], hidden: out.hiddenStates.subarray(last * h, (last + 1) * h) };
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
}

function newStats(promptTokens: number): GenerationStats {
  return {
    promptTokens, newTokens: 0, steps: 0, prefillMs: 0, decodeMs: 0, finishReason: '', acceptLengths: [], treeSizes: [],
    draftSizes: [], draftMs: 0, kvUsed: [], decodeTokensPerS: 0, meanAccepted: 0,
  };
}

/** Greedy decoding on top of what the backend has committed; speculative with a drafter and maxTree > 1. */
export async function generate(backend: OrtBackend, prompt: readonly number[], options: GenerateOptions): Promise<Generation> {
  const maxTree = options.maxTree ?? 1;
  const drafter = options.drafter ?? null;
  const speculative = drafter !== null && maxTree > 1;
  const policy = speculative && options.policy ? options.policy : new FullWidth(speculative ? maxTree : 1);
  const result: Generation = { tokenIds: [], stats: newStats(prompt.length) };
  const stats = result.stats;
  const started = performance.now();
  let step = await prefill(backend, prompt);
  stats.prefillMs = performance.now() - started;
  stats.steps = 1;
  const context = [...(options.history ?? []), ...prompt, step.root];
  let pending = [step.root];
  for (;;) {
    if (emit(result, pending, options)) break;
    if (options.signal?.aborted) {
      stats.finishReason = 'interrupted';
      break;
    }
    if (backend.length >= backend.capacity) {
      stats.finishReason = 'capacity';
      break;
    }
    const budget = policy.budget(backend.capacity - backend.length);
    let draftMs = 0;
    let proposal: DraftTree;
    if (budget > 1 && speculative) {
      const drafted = performance.now();
      proposal = await drafter.propose({ tokens: context, hidden: step.hidden }, budget);
      if (options.chainsOnly) proposal = proposal.bestPath();
      draftMs = performance.now() - drafted;
      stats.draftMs += draftMs;
    } else {
      proposal = DraftTree.rootOnly(step.root);
    }
    const verified = proposal.prefix(policy.choose(proposal, draftMs));
    const [path, next] = await verifyAndCommit(backend, verified.tokens, verified.parents);
    step = next;
    policy.observe(proposal, verified.size, path);
    stats.steps += 1;
    stats.draftSizes.push(proposal.size);
    stats.treeSizes.push(verified.size);
    stats.acceptLengths.push(path.length);
    stats.kvUsed.push(backend.length);
    pending = [...path.slice(1).map((i) => verified.tokens[i]), step.root];
    context.push(...pending);
  }
  stats.newTokens = result.tokenIds.length;
  stats.decodeMs = performance.now() - started - stats.prefillMs;
  stats.decodeTokensPerS = stats.decodeMs > 0 && stats.newTokens > 1 ? (stats.newTokens - 1) / (stats.decodeMs / 1e3) : 0;
  stats.meanAccepted = stats.acceptLengths.length ? stats.acceptLengths.reduce((a, b) => a + b, 0) / stats.acceptLengths.length : 0;
  return result;
}

/** Append tokens up to a stop token or the length limit; true when generation is over. */
function emit(result: Generation, tokens: readonly number[], options: GenerateOptions): boolean {
  for (const token of tokens) {
    result.tokenIds.push(token);
    options.onToken?.(token);
    if (options.eosTokenIds.has(token)) {
      result.stats.finishReason = 'eos';
      return true;
    }
    if (result.tokenIds.length >= options.maxNewTokens) {
      result.stats.finishReason = 'length';
      return true;
    }
  }
  return false;
}

