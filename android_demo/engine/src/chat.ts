/**
 * Multi-turn chat on one engine (runtime/chat.py): the conversation, the KV positions it keeps,
 * what overflow evicts.
 *
 *   prompt    – the whole history through the chat template, as Hugging Face renders it;
 *   reuse     – `cached` lists the tokens whose K/V positions are committed; a turn keeps the longest
 *               common prefix of those and its prompt, rewinds the rest and prefills only the tail;
 *   overflow  – when prompt + reply room exceeds C, the oldest turns are dropped (the system prompt
 *               stays) until it fits;
 *   interrupt – an aborted reply keeps what was streamed; `cached` is cut back to positions known
 *               to hold the prompt and the streamed tokens.
 */

import type { ConstraintSpec } from './constraint';
import { GenerationStats, WidthPolicy } from './decode';
import { Engine } from './engine';
import { ContextOverflowError } from './errors';
import { Message } from './tokenizer';
import { SHARED } from './shared';

export interface Turn {
  user: string;
  reply: string;
}

export interface Reply {
  text: string;
  tokenIds: number[]; // generated ids, the stop token included
  stats: GenerationStats;
  reused: number; // KV positions kept from earlier turns
  prefilled: number; // prompt tokens run this turn
  dropped: number; // oldest turns evicted to make room
  interrupted: boolean;
}

export interface SendOptions {
  onToken?: (id: number, textSoFar: string) => void;
  signal?: AbortSignal;
  constraint?: ConstraintSpec; // the reply is JSON (a schema, any object) or one of some strings: constraint.ts
}

export function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return n;
}

export class ChatSession {
  readonly system: string | null;
  readonly maxNewTokens: number;
  turns: Turn[] = [];
  cached: number[] = []; // the tokens of the committed KV positions, in order
  private policy: WidthPolicy | null | undefined = undefined; // one controller learns across turns

  constructor(readonly engine: Engine, options: { system?: string; maxNewTokens?: number } = {}) {
    this.system = options.system ?? null;
    this.maxNewTokens = options.maxNewTokens ?? SHARED.max_new_tokens.chat;
    if (this.maxNewTokens < 1) throw new RangeError('maxNewTokens must be >= 1');
  }

  get capacity(): number {
    return this.engine.backend.capacity;
  }

  /** Positions kept free for a reply when fitting the history: maxNewTokens, at most half of C. */
  get replyRoom(): number {
    return Math.min(this.maxNewTokens, Math.floor(this.capacity / 2));
  }

  messages(turns: readonly Turn[], user: string): Message[] {
    const history: Message[] = this.system ? [{ role: 'system', content: this.system }] : [];
    for (const turn of turns) history.push({ role: 'user', content: turn.user }, { role: 'assistant', content: turn.reply });
    return [...history, { role: 'user', content: user }];
  }

  /** [turns kept, prompt ids]: the oldest turns are dropped until prompt + reply room fit in C. */
  fit(user: string): [Turn[], number[]] {
    const tokenizer = this.engine.tokenizer;
    const turns = [...this.turns];
    let prompt = tokenizer.encodeChat(this.messages(turns, user));
    while (turns.length && prompt.length + this.replyRoom > this.capacity) {
      turns.shift();
      prompt = tokenizer.encodeChat(this.messages(turns, user));
    }
    if (prompt.length >= this.capacity) {
      throw new ContextOverflowError(`this message takes ${prompt.length} tokens with the chat template${this.system ? ' and system prompt' : ''}, and the KV cache holds ${this.capacity}: shorten it, or open the engine with a larger capacity`);
    }
    return [turns, prompt];
  }

  /** Generate the reply to `user` after the history, streaming to `onToken`; `signal` stops it early. */
  async send(user: string, options: SendOptions = {}): Promise<Reply> {
    const [turns, prompt] = this.fit(user); // throws before anything changes
    const dropped = this.turns.length - turns.length;
    const keep = Math.min(commonPrefix(this.cached, prompt), prompt.length - 1);
    this.cached = this.cached.slice(0, keep);
    this.turns = turns;
    if (this.policy === undefined) this.policy = await this.engine.policy();
    const tokenizer = this.engine.tokenizer;
    const streamed: number[] = [];
    const result = await this.engine.generate(prompt, {
      maxNewTokens: this.maxNewTokens, cached: keep, policy: this.policy, signal: options.signal, constraint: options.constraint,
      onToken: (id) => {
        streamed.push(id);
        if (options.onToken) options.onToken(id, tokenizer.decode(streamed.filter((t) => !tokenizer.eosTokenIds.has(t))));
      },
    });
    const interrupted = result.stats.finishReason === 'interrupted';
    this.keepPositions([...prompt, ...result.tokenIds]);
    const text = tokenizer.decode(result.tokenIds.filter((t) => !tokenizer.eosTokenIds.has(t)));
    this.turns.push({ user, reply: text });
    return { text, tokenIds: result.tokenIds, stats: result.stats, reused: keep, prefilled: prompt.length - keep, dropped, interrupted };
  }

  /** Record which tokens the committed positions hold; positions past them are forgotten. */
  private keepPositions(tokens: readonly number[]): void {
    const backend = this.engine.backend;
    this.cached = tokens.slice(0, Math.min(backend.length, tokens.length));
    backend.rewind(this.cached.length);
  }

  /** Forget the conversation (the system prompt stays) and empty the KV cache. */
  reset(): void {
    this.turns = [];
    this.cached = [];
    this.engine.backend.reset();
  }

  kvUsed(): number {
    return this.engine.backend.length;
  }
}
