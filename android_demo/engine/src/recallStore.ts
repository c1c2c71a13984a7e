/**
 * The store of what was already written (runtime/recall_store.py), the same store in TypeScript: earlier turns
 * and conversations kept to draft from, bounded in bytes, oldest tokens evicted first, in the same file.
 *
 * Layout, sizes as arithmetic (N tokens held, K = ORDERS.length n-gram orders):
 *     ring     int32 [N]       the last N tokens written; documents joined by SEPARATOR, which no n-gram spans
 *     tables   int64 [K, N]    per order n, an n-gram's hash → the absolute position after its latest occurrence
 *     bytes    = N · (4 + 8·K)                      (bytesFor / tokensFor)
 * The hash is Python's, bit for bit (FNV's prime as the polynomial's base, a multiplicative mix to a slot),
 * so both runtimes keep the same slots and lose the same colliding n-grams: a lookup answers alike in both.
 *
 * The file: a header line of JSON, the ring as little-endian int32, the SHA-256 of everything before it.
 * Either runtime reads the other's. A file of another format, tokenizer or version, or whose digest does
 * not match, is refused in one line (RecallError); the tables are rebuilt from the ring, never read.
 * Where the bytes live is the platform's (RecallFile): Node writes a file atomically (node.ts), a page or
 * an app keeps them where it keeps its data.
 */

import { SHARED } from './shared';


const STORE = SHARED.recall_store; // the file's format, which the Python runtime reads and writes alike
export const FORMAT = STORE.format;
export const VERSION = STORE.version;
export const ORDERS: readonly number[] = STORE.orders; // n-gram lengths indexed, shortest first; the longest matching one drafts
export const SEPARATOR = STORE.separator;
export const DEFAULT_BUDGET = STORE.budget;
const RING_BYTES = STORE.ring_bytes;
const SLOT_BYTES = STORE.slot_bytes;
const PRIME = BigInt(STORE.prime);
const MIX = BigInt(STORE.mix);
const MAX_ORDER = ORDERS[ORDERS.length - 1];

/** A store file that cannot be trusted (foreign, damaged, another tokenizer), or a store that cannot be sized. */
export class RecallError extends Error {
  override name = 'RecallError';
}

export function bytesFor(tokens: number): number {
  return tokens * (RING_BYTES + SLOT_BYTES * ORDERS.length);
}

export function tokensFor(budget: number): number {
  return Math.floor(budget / (RING_BYTES + SLOT_BYTES * ORDERS.length));
}

/** Where a store's bytes are kept between runs: a file (Node), IndexedDB (a page), the app's files (React Native). */
export interface RecallFile {
  readonly where: string; // for messages
  read(): Promise<Uint8Array | null>; // null: nothing saved yet
  write(bytes: Uint8Array): Promise<void>; // whole or not at all (the old bytes kept)
}

export type Digest = (bytes: Uint8Array) => Promise<Uint8Array>;

interface WebCrypto { subtle?: { digest(algorithm: string, data: Uint8Array): Promise<ArrayBuffer> } }

/** SHA-256 through Web Crypto (Node 20, browsers); a platform without it (React Native) passes its own. */
export const sha256: Digest = async (bytes) => {
  const subtle = (globalThis as { crypto?: WebCrypto }).crypto?.subtle;
  if (subtle === undefined) throw new RecallError('this platform has no crypto.subtle: give the recall store a SHA-256 digest function');
  return new Uint8Array(await subtle.digest('SHA-256', new Uint8Array(bytes))); // a copy over a plain ArrayBuffer
};

/** A string's UTF-8 bytes (no TextEncoder on every platform the engine runs on). */
export function utf8(text: string): Uint8Array {
  const out: number[] = [];
  for (const ch of text) {
    const c = ch.codePointAt(0)!;
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
  }
  return Uint8Array.from(out);
}

/** What makes token ids mean the same text: the tokenizer file's SHA-256, first 16 hex digits (as Python's). */
export async function fingerprint(tokenizerText: string, digest: Digest = sha256): Promise<string> {
  const hash = await digest(utf8(tokenizerText));
  return Array.from(hash.subarray(0, 8), (b) => b.toString(16).padStart(2, '0')).join('');
}

export const MAX_MATCH = STORE.max_match; // how far back a match is followed past its n-gram

export interface Match {
  continuation: number[]; // what followed the matched n-gram's latest occurrence
  order: number; // n: the n-gram that found it
  matched: number; // how many tokens back that occurrence matches the context (>= n, up to MAX_MATCH)
}

export class Recall {
  readonly ring: Int32Array;
  readonly tables: Float64Array; // [K·N] absolute positions (exact integers), -1 empty
  written = 0; // tokens written since the store began (absolute position of the next one)

  constructor(readonly capacity: number, readonly fingerprint: string) {
    if (!(Number.isInteger(capacity) && capacity >= 2 * MAX_ORDER)) {
      throw new RecallError(`a recall store of ${capacity} tokens is too small: give it at least ${bytesFor(2 * MAX_ORDER)} bytes`);
    }
    this.ring = new Int32Array(capacity).fill(SEPARATOR);
    this.tables = new Float64Array(ORDERS.length * capacity).fill(-1);
  }

  get nbytes(): number {
    return bytesFor(this.capacity);
  }

  get held(): number {
    return Math.min(this.written, this.capacity);
  }

  private at(position: number): number {
    return this.ring[position % this.capacity];
  }

  /** The table slot of the n-gram token(0) .. token(n - 1) (runtime/recall_store.py _hashes, then _slots). */
  private slot(n: number, token: (j: number) => number): number {
    let h = 0n;
    for (let j = 0; j < n; j++) h = BigInt.asUintN(64, h * PRIME + BigInt(token(j)));
    return Number((BigInt.asUintN(64, h * MIX) >> 32n) % BigInt(this.capacity));
  }

  /** A document (a turn's new tokens, a file): appended after a separator, indexed, the oldest evicted. */
  add(tokens: readonly number[]): void {
    if (tokens.length === 0) return;
    if (tokens.some((t) => !(Number.isInteger(t) && t >= 0))) throw new RecallError('token ids are non-negative integers');
    const values = [SEPARATOR, ...tokens.slice(-(this.capacity - 1))];
    const start = this.written;
    values.forEach((v, i) => { this.ring[(start + i) % this.capacity] = v; });
    this.written += values.length;
    this.index(start, this.written);
  }

  /** Index the n-grams whose next token sits at an absolute position in [start, stop) (runtime/recall_store.py _index). */
  private index(start: number, stop: number): void {
    const oldest = Math.max(0, this.written - this.capacity);
    for (let end = Math.max(start, oldest + 1); end < stop; end++) {
      if (this.at(end) === SEPARATOR) continue;
      let clean = 0; // how many tokens before `end` are not separators, up to the longest order
      while (clean < MAX_ORDER && end - clean - 1 >= oldest && this.at(end - clean - 1) !== SEPARATOR) clean++;
      ORDERS.forEach((n, k) => {
        if (n <= clean) this.tables[k * this.capacity + this.slot(n, (j) => this.at(end - n + j))] = end;
      });
    }
  }

  /** The continuation (up to `length` tokens, to its document's end) of the longest n-gram of ORDERS that ends
   * `context` and was written before, at its latest occurrence still held; null when none is. */
  lookup(context: readonly number[], length: number): Match | null {
    const oldest = this.written - this.capacity;
    for (let k = ORDERS.length - 1; k >= 0; k--) {
      const n = ORDERS[k];
      if (context.length < n) continue;
      const suffix = context.slice(context.length - n);
      const at = this.tables[k * this.capacity + this.slot(n, (j) => suffix[j])];
      if (at < 0 || at - n < oldest || at >= this.written) continue;
      if (suffix.some((t, i) => this.at(at - n + i) !== t)) continue; // a collision, or evicted text
      const out: number[] = [];
      for (let p = at; p < Math.min(at + length, this.written) && this.at(p) !== SEPARATOR; p++) out.push(this.at(p));
      if (out.length) return { continuation: out, order: n, matched: this.matched(context, at, n) };
    }
    return null;
  }

  /** How far back the text before absolute position `at` matches the context's end (n already do), within its
   * document and the ring, up to MAX_MATCH. */
  private matched(context: readonly number[], at: number, n: number): number {
    const oldest = Math.max(this.written - this.capacity, 0);
    let matched = n;
    while (matched < Math.min(MAX_MATCH, context.length) && at - 1 - matched >= oldest) {
      const token = this.at(at - 1 - matched);
      if (token === SEPARATOR || token !== context[context.length - 1 - matched]) break;
      matched++;
    }
    return matched;
  }

  clear(): void {
    this.ring.fill(SEPARATOR);
    this.tables.fill(-1);
    this.written = 0;
  }

  /** The store as the file holds it: header line, ring (oldest first, little-endian int32), SHA-256. */
  async toBytes(digest: Digest = sha256): Promise<Uint8Array> {
    const held = this.held;
    const header = utf8(`${JSON.stringify({ format: FORMAT, version: VERSION, tokenizer: this.fingerprint,
      capacity: this.capacity, held, written: this.written })}\n`);
    const body = new Uint8Array(header.length + 4 * held);
    body.set(header);
    const view = new DataView(body.buffer, header.length);
    for (let i = 0; i < held; i++) view.setInt32(4 * i, this.at(this.written - held + i), true);
    const out = new Uint8Array(body.length + 32);
    out.set(body);
    out.set(await digest(body), body.length);
    return out;
  }

  /** A saved store, whole and checked, into a store of `capacity` tokens (the newest tokens it holds that fit). */
  static async fromBytes(data: Uint8Array, options: { capacity: number; fingerprint: string; where?: string; digest?: Digest }): Promise<Recall> {
    const where = options.where ?? 'the recall store';
    const lineEnd = data.indexOf(0x0a);
    if (lineEnd < 0 || data.length < lineEnd + 1 + 32) throw new RecallError(`${where}: not a recall store (no header): remove it or give another file`);
    let header: Record<string, unknown> | null = null;
    try {
      header = JSON.parse(String.fromCharCode(...data.subarray(0, lineEnd))) as Record<string, unknown>; // ASCII
    } catch {
      header = null;
    }
    if (header === null || typeof header !== 'object' || header.format !== FORMAT) throw new RecallError(`${where}: not a recall store: remove it or give another file`);
    if (header.version !== VERSION) throw new RecallError(`${where}: a recall store of version ${String(header.version)}, this runtime reads ${VERSION}`);
    const body = data.subarray(0, data.length - 32);
    const digest = await (options.digest ?? sha256)(body);
    if (digest.some((b, i) => b !== data[data.length - 32 + i])) throw new RecallError(`${where}: the recall store is damaged (its digest does not match); it is started afresh`);
    if (header.tokenizer !== options.fingerprint) throw new RecallError(`${where}: a recall store written with another tokenizer; give each model its own file`);
    const held = Number(header.held);
    const ringBytes = body.length - lineEnd - 1;
    if (!(Number.isInteger(held) && held >= 0 && ringBytes === 4 * held)) throw new RecallError(`${where}: the recall store's header and contents disagree; it is started afresh`);
    const store = new Recall(options.capacity, options.fingerprint);
    const kept = Math.min(held, options.capacity);
    const view = new DataView(body.buffer, body.byteOffset + lineEnd + 1, ringBytes);
    for (let i = 0; i < kept; i++) store.ring[i] = view.getInt32(4 * (held - kept + i), true);
    store.written = kept;
    store.index(0, kept);
    return store;
  }
}

/** The store a file holds within `budget` bytes: read back when it can be trusted, else empty (a refused file is
 * named through `log`, and replaced on the next save). */
export async function openRecall(file: RecallFile | null, options: { budget?: number; fingerprint: string; log?: (line: string) => void; digest?: Digest }): Promise<Recall> {
  const capacity = tokensFor(options.budget ?? DEFAULT_BUDGET);
  if (capacity < 2 * MAX_ORDER) throw new RecallError(`a recall budget of ${options.budget} bytes holds no text: give it at least ${bytesFor(2 * MAX_ORDER)} bytes (e.g. 8 MiB)`);
  const saved = file === null ? null : await file.read();
  if (saved !== null) {
    try {
      return await Recall.fromBytes(saved, { capacity, fingerprint: options.fingerprint, where: file!.where, digest: options.digest });
    } catch (err) {
      if (!(err instanceof RecallError)) throw err;
      options.log?.(`recall: ${err.message}`);
    }
  }
  return new Recall(capacity, options.fingerprint);
}
