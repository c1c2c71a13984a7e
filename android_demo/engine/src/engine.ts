/**
 * An artifact opened for generation (runtime/engine.py): manifest → sizes → sessions and arena →
 * drafter and width policy.
 *
 *   sizes    – C, R and T_max, decided once (sizes.resolveSizes: the manifest's device plan, or
 *              `capacity` and the drafters' tree);
 *   open     – DecoderSession (decoder + heads graphs, one arena), tokenizer;
 *   drafter  – `drafter` or the manifest's choice (Medusa heads, the feature drafter, prompt lookup, merged), none in
 *              plain mode; with `recall`, the recall
 *              drafter merged in over a store (recall.ts) that every finished turn joins, saved after it;
 *   policy   – plain: none; tree: the drafter's whole tree; auto: the controller, over a verify
 *              latency curve measured once per engine;
 *   sampling – the request's settings, then the manifest's generation defaults (sampling.samplingFor, Python's
 *              rule): temperature 0 (or mode 'greedy') is argmax, token-identical in every mode.
 */

import { OrtBackend, checkFits } from './backend';
import { ConstraintSpec, GrammarEngine, XGrammar } from './constraint';
import { Controller, LatencyCurve, measureLatency } from './controller';
import { FullWidth, Generation, WidthPolicy, generate } from './decode';
import { Drafter } from './drafters/draft';
import { Merged } from './drafters/merged';
import { ConversationIndex, PromptLookup } from './drafters/lookup';
import { MedusaDrafter } from './drafters/medusa';
import { featureDrafter } from './drafters/feature';
import { DRAFTERS, DrafterName, parseDrafter, withRecall } from './drafters/names';
import { RecallDrafter } from './drafters/recall';
import { ConfigError } from './errors';
import { allocationBytes, kvBytes } from './arena';
import { Manifest, ManifestError, ModelFormat, RowRoute, bytesPerKvElement, manifestRoute, parseManifest } from './manifest';
import { probeRoute } from './routeProbe';
import { DecoderSession, OrtModule } from './session';
import { Sizes, exportedTree, resolveSizes } from './sizes';
import { ArtifactSource } from './source';
import { ChatTokenizer } from './tokenizer';
import { Digest, Recall, RecallFile, fingerprint, openRecall, sha256 } from './recallStore';
import { Sampling, SamplingRequest, samplingFor } from './sampling';
import { SHARED } from './shared';

/** How each step drafts (runtime/config.py Mode); how tokens are chosen is the sampling's. */
export type Mode = 'plain' | 'tree' | 'auto';
export const MODES = SHARED.modes.drafting as readonly Mode[];

/** A caller's mode word as a drafting mode: the older names too ('greedy': plain drafting, and argmax decoding as
 * openEngine reads it; 'medusa': tree). */
export function modeOf(word: string): Mode {
  const older: Record<string, string> = SHARED.modes.older;
  const mode = (older[word] ?? word) as Mode;
  if (!MODES.includes(mode)) {
    throw new ConfigError(`unknown mode ${JSON.stringify(word)}: use one of ${MODES.join(', ')} (or ${SHARED.modes.argmax})`);
  }
  return mode;
}

export interface EngineOptions {
  ort: OrtModule; // onnxruntime-node, onnxruntime-web or onnxruntime-react-native
  source: ArtifactSource;
  mode?: string; // a Mode (default auto), or an older name ('greedy', 'medusa': modeOf)
  drafter?: string; // e.g. 'medusa+lookup'; default the manifest's; ignored in plain mode
  capacity?: number; // C; default the manifest's plan, else the graph's max capacity
  sizes?: Sizes; // C, R and T_max as a plan fitted them (memory.ts fit: the page's budget); overrides `capacity`
  threads?: number; // intra-op threads, default 2
  modelFormat?: ModelFormat; // 'ort': the .ort graphs of an `export --mobile` artifact
  executionProviders?: string[];
  latencyCurve?: LatencyCurve; // skip measuring (auto mode)
  route?: RowRoute; // rows a call runs: one an earlier start probed here (Engine.route); default: probed at open
  recall?: RecallOptions; // draft from what was written before (earlier turns and conversations); off unless given
  // xgrammar's WebAssembly module (@mlc-ai/web-xgrammar; node.ts loadXGrammar): structured output; absent where
  // there is no WebAssembly (React Native's Hermes), and a constrained request then says so
  grammar?: XGrammar | (() => Promise<XGrammar>); // the module, or how to load it on the first constrained reply
  // how replies sample: what is not given comes from the manifest's generation defaults; temperature 0: greedy
  sampling?: SamplingRequest;
  log?: (line: string) => void;
}

/** The store the recall drafter reads: kept in `file` across runs (null: in memory, for the engine's life). */
export interface RecallOptions {
  file?: RecallFile | null;
  budget?: number; // bytes, default 8 MiB (recall.ts DEFAULT_BUDGET)
  digest?: Digest; // SHA-256; default Web Crypto's
}

export interface MemoryPlan {
  capacity: number; // C
  rows: number; // R
  tree: number; // T_max
  arenaBytes: number; // the one allocation: KV + step I/O
  kvBytes: number; // 2·L·H_kv·C·D·bytes
  recallBytes: number; // the recall store, N·(4 + 8·K), when its drafter runs
  summary: string;
}

export interface GenerateRequest {
  maxNewTokens: number;
  onToken?: (id: number) => void;
  mode?: Mode;
  cached?: number; // leading prompt tokens already committed (multi-turn)
  policy?: WidthPolicy | null; // a policy that outlives the reply (chat keeps one controller)
  ignoreEos?: boolean;
  signal?: AbortSignal;
  constraint?: ConstraintSpec; // the reply is JSON valid against a schema, any JSON object, or one of some strings
  sampling?: Sampling | null; // this reply's (null: greedy); default the engine's
}

const MIB = 2 ** 20;

function memoryPlan(m: Manifest, sizes: Sizes, session: DecoderSession, recall: Recall | null): MemoryPlan {
  const arena = allocationBytes(session.layout);
  const kv = kvBytes(session.layout);
  const d = m.dims;
  const bytes = bytesPerKvElement(m);
  const recallBytes = recall?.nbytes ?? 0;
  return {
    capacity: sizes.capacity, rows: sizes.rows, tree: sizes.tree, arenaBytes: arena, kvBytes: kv, recallBytes,
    summary: `C=${sizes.capacity} R=${sizes.rows} T_max=${sizes.tree}: KV ${(kv / MIB).toFixed(1)} MiB ` +
      `(2·${d.num_layers}·${d.num_kv_heads}·${sizes.capacity}·${d.head_dim}·${bytes} B), arena ${(arena / MIB).toFixed(1)} MiB` +
      (recall ? `, recall store ${(recallBytes / MIB).toFixed(1)} MiB (N=${recall.capacity} tokens)` : ''),
  };
}

/** The drafters an engine runs: none in plain mode, else `drafter` or the manifest's choice. */
export function drafterNames(mode: Mode, spec: string | undefined, m: Manifest): DrafterName[] {
  if (mode === 'plain') return [];
  const chosen = spec ?? m.drafter;
  return chosen ? parseDrafter(chosen) : [];
}

export class Engine {
  readonly backend: OrtBackend;
  private curve: LatencyCurve | null;
  private grammarEngine: Promise<GrammarEngine> | null = null;

  constructor(
    readonly options: EngineOptions,
    readonly manifest: Manifest,
    readonly session: DecoderSession,
    readonly tokenizer: ChatTokenizer,
    readonly drafter: Drafter | null,
    readonly maxTree: number, // T_max
    readonly mode: Mode,
    readonly plan: MemoryPlan,
    readonly recall: Recall | null = null, // the store the recall drafter reads
    readonly sampling: Sampling | null = null, // how replies sample unless a request says (null: greedy)
  ) {
    this.backend = new OrtBackend(session, options.route);
    this.curve = options.latencyCurve ?? null;
  }

  /** The numeric route the engine runs (probed at open, or given): a page keeps it for its next visit. */
  get route(): RowRoute {
    return this.options.route ?? manifestRoute(this.manifest);
  }

  /** The verify latency curve once measured (or given): a page keeps it for its next visit. */
  get latencyCurve(): LatencyCurve | null {
    return this.curve;
  }

  /** The width policy for `mode`: none for plain, the whole tree for tree, a fresh controller for auto. */
  async policy(mode: Mode = this.mode): Promise<WidthPolicy | null> {
    if (mode === 'tree') return new FullWidth(this.maxTree);
    if (mode !== 'auto') return null;
    if (this.curve === null) {
      this.options.log?.(`measuring ms per verify step for tree sizes up to ${this.maxTree} once ...`);
      this.curve = await measureLatency(this.backend, this.maxTree);
    }
    return new Controller(this.curve, this.maxTree);
  }

  /** One reply; `cached` leading prompt tokens are already committed (the rest is rewound and prefilled). */
  async generate(promptIds: readonly number[], request: GenerateRequest): Promise<Generation> {
    const mode = request.mode ?? this.mode;
    if (mode !== 'plain' && this.drafter === null) throw new ConfigError(`mode ${mode} needs a drafter: open the engine in a speculative mode`);
    const cached = request.cached ?? 0;
    if (!(cached >= 0 && cached < promptIds.length) || cached > this.backend.length) {
      throw new RangeError(`cached=${cached} must be committed (${this.backend.length} rows are) and leave at least one of the ${promptIds.length} prompt tokens to prefill`);
    }
    checkFits(cached, promptIds.length - cached, this.backend.capacity, this.backend.padding);
    // compiled before the cache is touched: a schema that does not compile is one line and loses nothing
    const constraint = request.constraint === undefined ? null : await (await this.grammar()).matcher(request.constraint);
    const speculative = mode !== 'plain';
    if (cached === 0) this.backend.reset();
    else this.backend.rewind(cached);
    return generate(this.backend, promptIds.slice(cached), {
      maxNewTokens: request.maxNewTokens,
      eosTokenIds: request.ignoreEos ? new Set() : this.tokenizer.eosTokenIds,
      drafter: speculative ? this.drafter : null,
      maxTree: speculative ? this.maxTree : 1,
      history: promptIds.slice(0, cached),
      onToken: request.onToken,
      policy: request.policy !== undefined ? request.policy : await this.policy(mode),
      chainsOnly: this.manifest.draft_shape === 'chain',
      signal: request.signal,
      constraint,
      sampling: request.sampling !== undefined ? request.sampling : this.sampling,
    }).then(async (out) => {
      if (this.recall !== null) { // the turn's new tokens, for the turns and conversations after it
        this.recall.add([...promptIds.slice(cached), ...out.tokenIds]);
        await this.saveRecall();
      }
      return out;
    });
  }

  /** The grammar engine over this artifact's tokenizer, made on the first constrained request. */
  grammar(): Promise<GrammarEngine> {
    const xgr = this.options.grammar;
    if (xgr === undefined) {
      return Promise.reject(new ConfigError('structured output needs the grammar engine (@mlc-ai/web-xgrammar, WebAssembly): open the engine with `grammar` (node.ts loadXGrammar); React Native\'s Hermes has no WebAssembly, so the app has no structured output'));
    }
    this.grammarEngine ??= Promise.all([typeof xgr === 'function' ? xgr() : xgr, this.options.source.readText(this.manifest.tokenizer.file)])
      .then(([module, json]) => GrammarEngine.create(module, json, this.manifest.dims.vocab_size, this.manifest.tokenizer.eos_token_ids, this.tokenizer));
    this.grammarEngine.catch(() => { this.grammarEngine = null; }); // a failed load is tried again next time
    return this.grammarEngine;
  }

  /** Add `text` (a project's file, an app's own prompts) to the recall store as one document, saved; the tokens added. */
  async remember(text: string): Promise<number> {
    if (this.recall === null) throw new ConfigError('remember() adds to the recall store: open the engine with `recall`');
    const ids = this.tokenizer.encode(text);
    this.recall.add(ids);
    await this.saveRecall();
    return ids.length;
  }

  /** Empty the recall store (and its file): nothing written before drafts any more. */
  async forget(): Promise<void> {
    if (this.recall === null) throw new ConfigError('this engine keeps no recall store: open it with `recall`');
    this.recall.clear();
    await this.saveRecall();
  }

  private async saveRecall(): Promise<void> {
    const file = this.options.recall?.file;
    if (this.recall !== null && file) await file.write(await this.recall.toBytes(this.options.recall?.digest ?? sha256));
  }

  async close(): Promise<void> {
    await this.session.close();
  }
}

export async function openEngine(options: EngineOptions): Promise<Engine> {
  const source = options.source;
  const m = parseManifest(await source.readText('manifest.json').catch((err: Error) => {
    throw new ManifestError(`no manifest.json in ${source.where} (${err.message.split('\n')[0]}): run \`specmemo export --out <folder>\` first`);
  }), `${source.where}/manifest.json`);
  const argmax = options.mode === SHARED.modes.argmax;
  const asking = options.sampling ?? {};
  if (argmax && ((asking.temperature ?? 0) > 0 || asking.topP !== undefined || asking.topK !== undefined || asking.repetitionPenalty !== undefined)) {
    throw new ConfigError(`mode ${SHARED.modes.argmax} decodes by argmax: temperature, top-p, top-k and the repetition penalty need sampling (mode plain with a temperature > 0)`);
  }
  const sampling = samplingFor(m.generation, argmax ? { ...asking, temperature: 0 } : asking);
  let mode = modeOf(options.mode ?? 'auto');
  const asked = drafterNames(mode, options.drafter, m);
  const names = options.recall && mode !== 'plain' ? withRecall(asked) : asked;
  for (const name of names) { // what each drafter needs from the artifact (the drafters' table, shared.json)
    const kind = DRAFTERS.get(name)!;
    if (kind.part !== null && m[kind.part] === null) {
      throw new ManifestError(`${source.where} has no ${kind.needs} for drafter '${name}': use drafter 'lookup', or re-export with ${kind.exportFlag}`);
    }
  }
  if (names.length === 0 && mode !== 'plain') mode = 'plain'; // nothing to speculate with
  const route = options.route ?? manifestRoute(m);
  const sizes = options.sizes ?? resolveSizes(m, names, options.capacity, undefined, route);
  const tokenizerText = await source.readText(m.tokenizer.file);
  const tokenizer = new ChatTokenizer(tokenizerText, m.tokenizer);
  const recall = names.includes('recall')
    ? await openRecall(options.recall?.file ?? null, { budget: options.recall?.budget, log: options.log, digest: options.recall?.digest,
      fingerprint: await fingerprint(tokenizerText, options.recall?.digest) })
    : null;
  const session = await DecoderSession.open(options.ort, source, m, {
    threads: options.threads ?? SHARED.threads, sizes, heads: names.includes('medusa'), feature: names.includes('feature'),
    modelFormat: options.modelFormat ?? 'onnx',
    executionProviders: options.executionProviders,
  });
  const parts: Drafter[] = [];
  const conversation = new ConversationIndex(); // one index of the conversation's n-grams for lookup and recall
  for (const name of names) {
    if (name === 'medusa') {
      parts.push(new MedusaDrafter({
        topK: m.heads!.top_k,
        draft: (hidden) => {
          session.arena.f32('heads_hidden').set(hidden);
          return session.runHeads();
        },
      }, exportedTree(m).prefix(sizes.tree)));
    } else if (name === 'lookup') {
      parts.push(new PromptLookup(conversation));
    } else if (name === 'recall') {
      parts.push(new RecallDrafter(recall!, conversation));
    } else if (name === 'feature') {
      parts.push(featureDrafter(session));
    }
  }
  const drafter = parts.length === 0 ? null : parts.length === 1 ? parts[0] : new Merged(parts);
  const plan = memoryPlan(m, sizes, session, recall);
  options.log?.(`plan: ${plan.summary}`);
  const probed = options.route ?? await probeRoute(session, m); // one row a call where this device computes it alike
  options.log?.(`route: ${probed.minRows}x${probed.multiple} (rows a call at least x a multiple of)`);
  return new Engine({ ...options, route: probed }, m, session, tokenizer, drafter, sizes.tree, mode, plan, recall, sampling);
}
