/**
 * Constrained decoding (runtime/constraint.py): a reply held to a JSON schema, any JSON object or a choice among
 * strings, as a token mask at every position. Python's engine is llguidance; here it is xgrammar compiled to
 * WebAssembly (`@mlc-ai/web-xgrammar`, the library WebLLM uses), handed in by the host (node.ts loads it for Node,
 * the web page imports it), so the engine itself needs no WebAssembly: React Native's Hermes has none.
 *
 *     const grammar = await GrammarEngine.create(xgrammar, tokenizerJson, vocabSize, eosTokenIds, tokenizer);
 *     const matcher = await grammar.matcher({ kind: 'json_schema', schema });   // one per reply
 *
 * The decode loop (decode.ts) asks the matcher what Python's asks: the tokens allowed next (`mask`), the drafted
 * nodes it forbids (`along`, before the verify pays for them) and the tokens it forces (`forced`: decided without
 * a model step of their own). JSON is compact, as in Python: no free whitespace, separators "," and ":".
 *
 * Forced tokens: xgrammar gives the forced text; it is tokenized as the tokenizer would, and its last tokens are
 * held back where more text could merge into a longer token the grammar allows (llguidance's rule, approximated on
 * the encoded vocabulary: a longer token starting with the held-back text whose rest begins with a character some
 * allowed token begins with).
 */

import type * as XG from '@mlc-ai/web-xgrammar';

import { DraftTree } from './drafters/draft';

export type XGrammar = typeof XG;

export type ConstraintSpec =
  | { kind: 'json_schema'; schema: string } // the schema as JSON text
  | { kind: 'json_object' }
  | { kind: 'choice'; choices: readonly string[] };

export const NO_TOKEN = -1; // the grammar allowed nothing

export class ConstraintError extends Error {
  override name = 'ConstraintError';
}

interface Encoder {
  encodeRaw(text: string): number[];
}

/** xgrammar's view of an artifact's tokenizer: made once per artifact, on the first constrained reply. */
export class GrammarEngine {
  private sorted: string[] | null = null; // the encoded vocabulary, sorted: prefix ranges by binary search

  private constructor(
    private readonly xgr: XGrammar,
    private readonly compiler: XG.GrammarCompiler,
    readonly vocab: readonly string[], // [V] each token as tokenizer.json encodes it ('' where there is none)
    private readonly encoder: Encoder,
  ) {}

  static async create(xgr: XGrammar, tokenizerJson: string, vocabSize: number, eosTokenIds: readonly number[],
    encoder: Encoder): Promise<GrammarEngine> {
    const parsed = JSON.parse(tokenizerJson) as { model: { type?: string; vocab?: Record<string, number> };
      decoder?: { type?: string }; added_tokens?: { id: number; content: string }[] };
    if (parsed.model.type !== 'BPE' || !parsed.model.vocab) {
      throw new ConstraintError(`this model's tokenizer (${parsed.model.type ?? 'unknown'}) is not read by the grammar engine here: constrained replies need a BPE tokenizer`);
    }
    const vocab = new Array<string>(vocabSize).fill('');
    for (const [token, id] of Object.entries(parsed.model.vocab)) if (id < vocabSize) vocab[id] = token;
    for (const t of parsed.added_tokens ?? []) if (t.id < vocabSize) vocab[t.id] = t.content;
    const kind = parsed.decoder?.type === 'ByteLevel' ? 'byte_level' : 'byte_fallback';
    const info = await xgr.TokenizerInfo.createTokenizerInfo(vocab, kind, false, vocabSize, [...eosTokenIds]);
    return new GrammarEngine(xgr, await xgr.GrammarCompiler.createGrammarCompiler(info), vocab, encoder);
  }

  /** A fresh matcher for one reply: a one-line ConstraintError naming the field when the spec does not compile. */
  async matcher(spec: ConstraintSpec): Promise<Matcher> {
    let compiled: XG.CompiledGrammar;
    try {
      if (spec.kind === 'choice') {
        if (spec.choices.length === 0 || spec.choices.some((c) => c === '')) throw new Error('give at least one non-empty string to choose from');
        compiled = await this.compiler.compileGrammar(`root ::= ${spec.choices.map((c) => JSON.stringify(c)).join(' | ')}`);
      } else {
        const schema = spec.kind === 'json_object' ? '{"type": "object"}' : spec.schema;
        JSON.parse(schema); // a one-line error for text that is not JSON, before the compiler's
        const grammar = await this.xgr.Grammar.fromJSONSchema(schema, false, -1, [',', ':'], false);
        // xgrammar writes ", " between the items of a value the schema leaves untyped whatever the separators
        // asked; compact, as llguidance's JSON is
        const ebnf = grammar.toString().replaceAll('(", " basic_', '("," basic_');
        grammar.dispose();
        compiled = await this.compiler.compileGrammar(ebnf, 'root');
      }
    } catch (err) {
      const field = spec.kind === 'choice' ? 'choices' : 'schema';
      throw new ConstraintError(`${field}: ${String((err as Error).message ?? err).split('\n')[0].slice(0, 300)}`);
    }
    // terminated once the grammar is complete (llguidance's `is_stopped`): the reply ends there, no stop token
    return new Matcher(await this.xgr.GrammarMatcher.createGrammarMatcher(compiled, undefined, true, 64), this);
  }

  /** Token ids of `text` as the tokenizer splits it (no special tokens). */
  encode(text: string): number[] {
    return this.encoder.encodeRaw(text);
  }

  /** Whether some token is longer than `prefix` and starts with it, its rest beginning with one of `starts`. */
  extends(prefix: string, starts: ReadonlySet<string>): boolean {
    if (this.sorted === null) this.sorted = this.vocab.filter((t) => t !== '').sort();
    const s = this.sorted;
    let lo = 0;
    let hi = s.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (s[mid] < prefix) lo = mid + 1; else hi = mid;
    }
    for (let i = lo; i < s.length && s[i].startsWith(prefix); i++) {
      if (s[i].length > prefix.length && starts.has(s[i][prefix.length])) return true;
    }
    return false;
  }
}

/** Where one reply stands in its grammar: tokens consumed as they are decided, tried along a drafted tree. */
export class Matcher {
  consumed = 0;

  constructor(private readonly m: XG.GrammarMatcher, private readonly grammar: GrammarEngine) {}

  /** The grammar is complete (the reply ends here). */
  get done(): boolean {
    return this.m.isTerminated();
  }

  /**
   * [V] 1 where the token may come next. Where the grammar forces text, only the first of its forced tokens:
   * llguidance's masks keep a forced run to its canonical tokenization, and so does this one.
   */
  async mask(): Promise<Uint8Array> {
    const forced = await this.forced();
    if (forced.length > 0) {
      const one = new Uint8Array(this.grammar.vocab.length);
      one[forced[0]] = 1;
      return one;
    }
    return this.grammarMask();
  }

  private async grammarMask(): Promise<Uint8Array> {
    const bits = await this.m.getNextTokenBitmask();
    const v = this.grammar.vocab.length;
    const out = new Uint8Array(v);
    if (this.done) return out;
    for (let i = 0; i < v; i++) out[i] = (bits[i >> 5] >>> (i & 31)) & 1;
    return out;
  }

  consume(tokens: readonly number[]): void {
    for (const t of tokens) {
      if (!this.m.acceptToken(t)) throw new ConstraintError(`constraint: token ${t} not allowed here`);
      this.consumed += 1;
    }
  }

  rollback(count: number): void {
    if (count > 0) {
      this.m.rollBack(count);
      this.consumed -= count;
    }
  }

  /** The tokens the grammar forces next, whatever the model would say (may be none); not consumed. */
  async forced(): Promise<number[]> {
    if (this.done) return [];
    const text = this.m.findJumpForwardString();
    if (text === '') return [];
    const tokens: number[] = [];
    for (const t of this.grammar.encode(text)) { // as far as the grammar takes them
      if (!this.m.acceptToken(t)) break;
      tokens.push(t);
    }
    const end = await this.grammarMask();
    this.m.rollBack(tokens.length);
    const starts = new Set<string>();
    end.forEach((ok, t) => { if (ok && this.grammar.vocab[t] !== '') starts.add(this.grammar.vocab[t][0]); });
    return tokens.slice(0, tokens.length - this.heldBack(tokens, starts));
  }

  /** How many of the forced tokens' last ones more text could merge into a longer allowed token. */
  private heldBack(tokens: readonly number[], starts: ReadonlySet<string>): number {
    const last = tokens.slice(-4).map((t) => this.grammar.vocab[t]);
    const text = last.join('');
    for (let at = 0; at < text.length; at++) {
      if (!this.grammar.extends(text.slice(at), starts)) continue;
      let covered = 0;
      let count = 0;
      while (covered < text.length - at) covered += last[last.length - 1 - count++].length;
      return count;
    }
    return 0;
  }

  /**
   * A drafted tree (node 0: the root, already consumed) walked depth-first: the nodes the grammar allows after
   * their parent (a forbidden node's subtree goes with it), in order, and the mask after each kept node.
   */
  async along(tree: DraftTree): Promise<[number[], Map<number, Uint8Array>]> {
    const children = new Map<number, number[]>();
    tree.parents.forEach((p, i) => { if (i > 0) children.set(p, [...(children.get(p) ?? []), i]); });
    const kept = [0];
    const masks = new Map<number, Uint8Array>([[0, await this.mask()]]);
    const visit = async (node: number): Promise<void> => {
      for (const child of children.get(node) ?? []) {
        if (!masks.get(node)![tree.tokens[child]]) continue;
        this.consume([tree.tokens[child]]);
        kept.push(child);
        masks.set(child, await this.mask());
        await visit(child);
        this.rollback(1);
      }
    };
    await visit(0);
    return [kept.sort((a, b) => a - b), masks];
  }
}

/** The argmax of a row's logits among the allowed tokens (NO_TOKEN when none is allowed). */
export function chooseMasked(logits: Float32Array, row: number, allowed: Uint8Array): number {
  const v = allowed.length;
  let best = NO_TOKEN;
  let value = -Infinity;
  for (let t = 0; t < v; t++) {
    if (!allowed[t]) continue;
    const z = logits[row * v + t];
    if (best === NO_TOKEN || z > value) {
      best = t;
      value = z;
    }
  }
  return best;
}
