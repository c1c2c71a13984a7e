/** Unit tests of the engine's pure parts, by hand and against the Python runtime's rules. */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ALIGN, Arena, allocationBytes, kvBytes, views } from '../src/arena';
import { Controller, DECISION_LOG, LatencyCurve } from '../src/controller';
import { ScoreCalibration, rescored, trials } from '../src/drafters/scoreCalibration';
import { KVCache, OrtModule } from '../src/session';
import { parseRoute, routeRowsFor } from '../src/backend';
import { Reply, accept } from '../src/decode';
import type { Matcher } from '../src/constraint';
import { type DraftContext, DraftTree, merge, ordered } from '../src/drafters/draft';
import { Merged } from '../src/drafters/merged';
import { ConversationIndex, NgramIndex, PromptLookup } from '../src/drafters/lookup';
import { parseDrafter, withRecall } from '../src/drafters/names';
import { RecallDrafter } from '../src/drafters/recall';
import { ORDERS, Recall, RecallError, bytesFor, tokensFor } from '../src/recallStore';
import { EmbeddingTable, halfToFloat } from '../src/embedding';
import { MedusaTree, expectedAccepted, rankAccuracyFromCumulative } from '../src/medusaTree';
import { chain, depths, pathTo, treeBias } from '../src/tree';
import { DEFAULTS, OFF, Sampling, acceptExact, distribution, largest, samplingFor } from '../src/sampling';
import { pick, splitmix64 } from '../src/draws';

const X = -Infinity;

test('a hand-drawn tree: depths, ancestor bias, paths', () => {
  //      0
  //    /   \
  //   1     2
  //   |
  //   3
  const parents = [-1, 0, 0, 1];
  assert.deepEqual(depths(parents), [0, 1, 1, 2]);
  assert.deepEqual([...treeBias(parents)], [
    0, X, X, X,
    0, 0, X, X,
    0, X, 0, X,
    0, 0, X, 0,
  ]);
  assert.deepEqual(pathTo(parents, 3), [0, 1, 3]);
  assert.deepEqual(chain(3), [-1, 0, 1]);
  assert.throws(() => depths([-1, 2, 0]), /parents must come before/);
});

test('greedy acceptance walks the argmax children', () => {
  // tokens [root=5, 7, 8, 9]; the model wants 7 after the root, 9 after node 1, then 4
  assert.deepEqual(accept([5, 7, 8, 9], [-1, 0, 0, 1], [7, 9, 0, 4]), [0, 1, 3]);
  assert.deepEqual(accept([5, 7], [-1, 0], [6, 0]), [0]);
});

test('arena: 64-byte aligned views whose bytes add up to the allocation', () => {
  const layout = { numLayers: 2, numKvHeads: 3, headDim: 16, hiddenSize: 48, vocabSize: 100, capacity: 37, rows: 5,
    logitRows: 4, numHeads: 2, topK: 3, kvDtype: 'float16' as const, batch: 1 };
  const arena = new Arena(layout);
  const perView = 3 * 37 * 16 * 2; // B·H_kv·C·D·2 bytes (float16), one of 2L = 4 views
  assert.equal(kvBytes(layout), 4 * Math.ceil(perView / ALIGN) * ALIGN);
  assert.equal(arena.nbytes, allocationBytes(layout));
  for (const name of views(layout).map((v) => v.name)) {
    const view = name.startsWith('kv.') ? arena.kv()[Number(name.slice(3))] : name.endsWith('ids') || name.endsWith('indices') ? arena.i64(name) : arena.f32(name);
    assert.equal(view.byteOffset % ALIGN, 0, name);
  }
  assert.equal(arena.f32('logits').length, 4 * 100);
  assert.equal(arena.i64('heads_token_ids').length, 2 * 3);
});

test('the useful tree\'s arithmetic: per-rank hits from the cumulative table, expected tokens per step', () => {
  const hits = rankAccuracyFromCumulative([[0.5, 0.75], [0.25, 0.375]]); // binary fractions: exact differences
  assert.deepEqual(hits, [[0.5, 0.25], [0.25, 0.125]]);
  // the root's bonus + P(head 0 rank 0) + P(head 0 rank 1) + P(rank 0, then head 1 rank 0)
  assert.equal(expectedAccepted(new MedusaTree([[0], [1], [0, 0]]), hits), 1 + 0.5 + 0.25 + 0.5 * 0.25);
  assert.equal(expectedAccepted(new MedusaTree([]), hits), 1);
});

test('drafts: ordered caps scores and keeps parents first; merge is a token trie', () => {
  const tree = ordered([1, 2, 3, 4], [-1, 0, 0, 1], [1, 0.2, 0.5, 0.9], 4);
  assert.deepEqual(tree.tokens, [1, 3, 2, 4]);
  assert.deepEqual(tree.parents, [-1, 0, 0, 2]);
  assert.deepEqual(tree.scores, [1, 0.5, 0.2, 0.2]);
  const a = new DraftTree([1, 2, 3], [-1, 0, 1], [1, 0.5, 0.4]);
  const b = new DraftTree([1, 2, 9], [-1, 0, 1], [1, 0.7, 0.6]);
  const merged = merge(a, b, 8);
  assert.deepEqual(merged.tokens, [1, 2, 9, 3]);
  assert.deepEqual(merged.parents, [-1, 0, 1, 1]);
  assert.deepEqual(merged.bestPath().tokens, [1, 2, 9]);
  assert.equal(merge(a, b, 2).size, 2);
});

test('medusa tree: parents and candidate indices from choices', () => {
  const medusa = new MedusaTree([[0], [1], [0, 0], [0, 1], [1, 0]]);
  assert.deepEqual(medusa.parents(), [-1, 0, 0, 1, 1, 2]);
  assert.deepEqual(medusa.candidateIndices(4), [0, 1, 4, 5, 4]);
  assert.equal(medusa.prefix(3).size, 3);
  assert.throws(() => new MedusaTree([[0, 0]]), /before its parent/);
});

test('prompt lookup continues the latest earlier match of the longest suffix', () => {
  const index = new NgramIndex();
  index.extend([1, 2, 3, 4, 9, 2, 3]);
  assert.deepEqual(index.continuation(3), [[4, 9, 2], 2]);
  const copy = new NgramIndex();
  copy.extend([5, 6, 7, 8, 9, 1, 2, 3, 0, 5, 6, 7, 8, 9, 1, 2, 3]);
  assert.deepEqual(copy.continuation(2), [[0, 5], 8]); // found by 4 tokens, matching 8 back (as Python)
});

test('controller pieces: latency interpolation and score bands as numpy does', () => {
  const curve = new LatencyCurve([1, 2, 4], [10, 12, 20]);
  assert.equal(curve.step(3), 16);
  assert.equal(curve.step(9), 20);
  const calibration = new ScoreCalibration();
  assert.equal(calibration.band(0.0), 0);
  assert.equal(calibration.band(0.02), 1); // side="right": an edge belongs to the band above
  assert.equal(calibration.band(1.0), 9);
  assert.ok(Math.abs(calibration.chance(0.95) - 0.95) < 1e-12);
});

test('the controller\'s decision log keeps the newest and does not grow with the turns', () => {
  const controller = new Controller(new LatencyCurve([1, 2], [10, 11]), 2);
  const draft = new DraftTree([0, 1], [-1, 0], [1, 0.9]);
  for (let i = 0; i < DECISION_LOG + 10; i++) {
    const size = controller.choose(draft, 0.1);
    controller.observe(draft, size, [0, 1].slice(0, size));
  }
  assert.equal(controller.steps, DECISION_LOG + 10);
  assert.equal(controller.decisions.length, DECISION_LOG);
});

test('float16 rows decode exactly; drafter names are checked', () => {
  assert.equal(halfToFloat(0x3c00), 1);
  assert.equal(halfToFloat(0xc000), -2);
  assert.equal(halfToFloat(0x0001), 2 ** -24);
  assert.deepEqual(parseDrafter('medusa+lookup'), ['medusa', 'lookup']);
  assert.throws(() => parseDrafter('medusa+nope'), /unknown drafter "nope"/);
});

/** An artifact source whose one file is `file` (the embedding tests read rows of it). */
function bytesSource(file: Uint8Array) {
  return {
    where: 'memory',
    readText: () => Promise.resolve(''),
    readBytes: (_: string, offset: number, length: number) => Promise.resolve(file.slice(offset, offset + length)),
    graph: () => Promise.resolve({ model: '' }),
  };
}

test('quantized rows with a per-block minimum decode as numpy does: scale · q, then + minimum, in float32', async () => {
  // one row of 64 values in two blocks of 32: 4-bit codes, float32 scales, float32 minimums (a GGUF Q4_K table)
  const codes = Array.from({ length: 64 }, (_, i) => (i * 7) % 16);
  const values = new Uint8Array(32);
  for (let i = 0; i < 64; i += 2) values[i >> 1] = codes[i] | (codes[i + 1] << 4);
  const scales = new Float32Array([0.0123, 0.00071]);
  const minimums = new Float32Array([-0.1, -0.0531]);
  const file = new Uint8Array(32 + 8 + 8);
  file.set(values, 0);
  file.set(new Uint8Array(scales.buffer), 32);
  file.set(new Uint8Array(minimums.buffer), 40);
  const source = bytesSource(file);
  const table = new EmbeddingTable(source, {
    file: 'embedding.q', dtype: 'float32', shape: [1, 64],
    quantized: { bits: 4, block_size: 32, zero_point: 0, values_offset: 0, scales_offset: 32, scales_dtype: 'float32', minimums_offset: 40 },
  });
  const row = new Float32Array(64);
  await table.lookup([0], row);
  for (let i = 0; i < 64; i++) {
    const b = i >> 5;
    assert.equal(row[i], Math.fround(Math.fround(codes[i] * scales[b]) + minimums[b]));
  }
});

test('factored scales and minimums (a k-quant\'s f16 d per 8 blocks times a uint8) decode as runtime/embedding.py does', async () => {
  // one row of 512 values in 16 blocks of 32: 4-bit codes; scales d · c, minimums (−dmin) · m, two groups of 8 blocks
  const codes = Array.from({ length: 512 }, (_, i) => (i * 5 + 3) % 16);
  const values = new Uint8Array(256);
  for (let i = 0; i < 512; i += 2) values[i >> 1] = codes[i] | (codes[i + 1] << 4);
  const half = (d: number[], c: number[]) => {
    const bytes = new Uint8Array(4 + 16);
    new DataView(bytes.buffer).setUint16(0, d[0], true);
    new DataView(bytes.buffer).setUint16(2, d[1], true);
    bytes.set(c, 4);
    return bytes;
  };
  const dBits = [0x1e66, 0x2155]; // two f16 scales
  const mBits = [0x9c00, 0xa0f3]; // two negated f16 minimums' d
  const c = Array.from({ length: 16 }, (_, b) => (b * 11 + 1) % 64);
  const m = Array.from({ length: 16 }, (_, b) => (b * 7 + 2) % 64);
  const file = new Uint8Array(256 + 20 + 20);
  file.set(values, 0);
  file.set(half(dBits, c), 256);
  file.set(half(mBits, m), 276);
  const source = bytesSource(file);
  const table = new EmbeddingTable(source, {
    file: 'embedding.q', dtype: 'float32', shape: [1, 512],
    quantized: { bits: 4, block_size: 32, zero_point: 0, values_offset: 0, scales_offset: 256, scales_dtype: 'float32', minimums_offset: 276, scale_group: 8 },
  });
  const row = new Float32Array(512);
  await table.lookup([0], row);
  for (let i = 0; i < 512; i++) {
    const b = i >> 5;
    const scale = Math.fround(halfToFloat(dBits[b >> 3]) * c[b]);
    const minimum = Math.fround(halfToFloat(mBits[b >> 3]) * m[b]);
    assert.equal(row[i], Math.fround(Math.fround(codes[i] * scale) + minimum));
  }
});

test('the numeric route pads a call to its minimum rows and multiple, as runtime/row_route.py does', () => {
  assert.deepEqual([1, 2, 3, 16].map((n) => routeRowsFor(n, 2, 1, 16)), [2, 2, 3, 16]);
  assert.deepEqual([1, 2, 3, 15, 16].map((n) => routeRowsFor(n, 2, 2, 16)), [2, 2, 4, 16, 16]);
  assert.equal(routeRowsFor(15, 2, 2, 15), 15); // never past the arena's rows
  assert.deepEqual([1, 4, 5, 9].map((n) => routeRowsFor(n, 4, 4, 16)), [4, 4, 8, 12]); // tiles of four (aarch64)
  assert.deepEqual(parseRoute('4x4'), { minRows: 4, multiple: 4 });
  assert.throws(() => parseRoute('2x3'), /rows x multiple/);
  assert.throws(() => parseRoute('0x1'), /rows x multiple/);
});

test('KV span: committed rows keep their values when the span grows and shrinks', () => {
  // 3 heads (with 2, no head's new rows can land on another's old ones), D = 2, C = 8:
  // rows r of head h hold [10·h + r, 10·h + r + 0.5]
  const fakeOrt = { Tensor: class { constructor(readonly type: string, readonly data: unknown, readonly dims: number[]) {} } };
  const view = new Float32Array(3 * 8 * 2);
  const kv = new KVCache(fakeOrt as unknown as OrtModule, 'float32', [view], 3, 2, 8);
  const rows = (span: number) => [0, 1, 2].map((h) => [0, 1, 2].map((r) => [...view.subarray((h * span + r) * 2, (h * span + r) * 2 + 2)]));
  kv.tensorsFor(2, 0); // 2 attended positions: span 8 → SPAN_STEP-rounded, shrinks when SPAN_STEP < 8
  const span = kv.span;
  for (let h = 0; h < 3; h++) for (let r = 0; r < 3; r++) view.set([10 * h + r, 10 * h + r + 0.5], (h * span + r) * 2);
  const before = rows(span);
  (kv as unknown as { relayout(span: number, keep: number): void }).relayout(4, 3); // shrink to 4
  assert.deepEqual(rows(4), before);
  (kv as unknown as { relayout(span: number, keep: number): void }).relayout(8, 3); // grow to 8
  assert.deepEqual(rows(8), before);
  assert.deepEqual((kv.tensorsFor(3, 3)[0] as unknown as { dims: number[] }).dims, [1, 3, 8, 2]);
});

test('recall: exact bytes, the longest match drafts to its document\'s end, eviction, files refused in one line', async () => {
  for (const budget of [4096, 8 * 2 ** 20, 10 ** 6 + 7]) {
    const store = new Recall(tokensFor(budget), 'fp');
    assert.ok(store.nbytes === bytesFor(store.capacity) && store.nbytes <= budget && budget < bytesFor(store.capacity + 1));
    assert.equal(store.nbytes, store.capacity * (4 + 8 * ORDERS.length));
  }
  const store = new Recall(1000, 'fp');
  store.add([5, 6, 7, 8, 9, 10, 11]);
  store.add([1, 6, 7, 20, 21]);
  assert.deepEqual(store.lookup([99, 6, 7, 8], 10), { continuation: [9, 10, 11], order: 3, matched: 3 });
  assert.equal(store.lookup([5, 6, 7, 8], 10)?.matched, 4); // found by 3 tokens, matching 4 back (to the document's start)
  assert.deepEqual(store.lookup([0, 6, 7], 10)?.continuation, [20, 21]); // the latest occurrence wins
  assert.equal(store.lookup([9, 10, 11], 10), null); // nothing follows a document's end
  assert.equal(store.lookup([11, 1], 10), null); // no n-gram spans two documents
  const tree = await new RecallDrafter(store).propose({ tokens: [3, 6, 7, 8], hidden: new Float32Array() }, 3);
  assert.deepEqual([tree.tokens, tree.parents], [[8, 9, 10], [-1, 0, 1]]);
  assert.ok(tree.scores[1] > tree.scores[2]);
  assert.deepEqual(withRecall(parseDrafter('medusa+lookup')), ['medusa', 'lookup', 'recall']);
  const own = new RecallDrafter(store); // the conversation's own text first (as Python)
  assert.equal((await own.propose({ tokens: [5, 6, 7, 8, 9, 10, 11, 1, 5, 6, 7, 8], hidden: new Float32Array() }, 4)).size, 1);
  assert.deepEqual((await own.propose({ tokens: [0, 6, 7, 8, 3, 5, 6, 7, 8], hidden: new Float32Array() }, 4)).tokens, [8, 9, 10, 11]);
  const conversation = new ConversationIndex(); // lookup and recall sharing one index draft as with their own
  const shared = [new PromptLookup(conversation), new RecallDrafter(store, conversation)];
  const apart = [new PromptLookup(), new RecallDrafter(store)];
  for (const tokens of [[0, 6, 7, 8, 3, 5, 6, 7, 8], [5, 6, 7, 8, 9, 10, 11, 1, 5, 6, 7, 8]]) {
    for (let i = 0; i < 2; i++) {
      const context = { tokens, hidden: new Float32Array() };
      assert.deepEqual((await shared[i].propose(context, 4)).tokens, (await apart[i].propose(context, 4)).tokens);
    }
  }

  const small = new Recall(tokensFor(4096), 'fp');
  const first = Array.from({ length: 30 }, (_, i) => 100 + i);
  small.add(first);
  for (let i = 0; i < 20; i++) small.add(Array.from({ length: 30 }, (_, j) => 1000 + 30 * i + j));
  assert.equal(small.lookup(first.slice(0, 10), 5), null); // evicted
  assert.equal(small.held, small.capacity);
  const bytes = await small.toBytes();
  const back = await Recall.fromBytes(bytes, { capacity: small.capacity, fingerprint: 'fp' });
  assert.deepEqual(back.lookup([1570, 1571], 3), small.lookup([1570, 1571], 3));
  const damaged = bytes.slice();
  damaged[damaged.length - 40] ^= 1;
  await assert.rejects(Recall.fromBytes(damaged, { capacity: 100, fingerprint: 'fp' }), /damaged/);
  await assert.rejects(Recall.fromBytes(bytes, { capacity: 100, fingerprint: 'other' }), /another tokenizer/);
  await assert.rejects(Recall.fromBytes(new TextEncoder().encode('{}\n' + 'x'.repeat(40)), { capacity: 100, fingerprint: 'fp' }), RecallError);
});

test('merged parts are rescored by their own calibration, judged by the text decoded after each draft (as Python)', async () => {
  const draft = new DraftTree([5, 7, 8, 9, 4], [-1, 0, 0, 1, 3], [1, 0.9, 0.5, 0.8, 0.7]);
  assert.deepEqual(trials(draft, [7, 9]), [[0.9, 0.5, 0.8], [true, false, true]]);
  assert.deepEqual(trials(draft, [7, 3, 4])[1], [true, false, false, false]);
  const calibration = new ScoreCalibration();
  for (let i = 0; i < 50; i++) calibration.observe(0.95, false);
  assert.deepEqual(rescored(new DraftTree([1, 2, 3], [-1, 0, 0], [1, 0.95, 0.25]), calibration).tokens, [1, 3, 2]);
  const fixed = (name: string, token: number, score: number) => ({
    name, propose: (c: { tokens: number[] }) => Promise.resolve(new DraftTree([c.tokens[c.tokens.length - 1], token], [-1, 0], [1, score])),
  });
  const merged = new Merged([fixed('bold', 100, 0.95), fixed('modest', 200, 0.25)]);
  const tokens = [1];
  assert.deepEqual((await merged.propose({ tokens, hidden: new Float32Array() }, 2)).tokens, [1, 100]);
  for (let i = 0; i < 40; i++) {
    tokens.push(200, 200);
    await merged.propose({ tokens, hidden: new Float32Array() }, 3);
  }
  assert.deepEqual((await merged.propose({ tokens, hidden: new Float32Array() }, 2)).tokens, [200, 200]);
});

test('under a grammar, a drafter of tokens alone drafts past the forced chain, hung under it (as decode.py)', async () => {
  const V = 16;
  const all = () => new Uint8Array(V).fill(1);
  const matcher = { // what Reply asks of a matcher: its mask here, and the masks along a draft
    mask: () => Promise.resolve(all()),
    along: (tree: DraftTree): Promise<[number[], Map<number, Uint8Array>]> =>
      Promise.resolve([tree.tokens.map((_, i) => i), new Map(tree.tokens.map((_, i) => [i, all()]))]),
  } as unknown as Matcher;
  const asked: (number | undefined)[] = [];
  const drafter = { name: 'fake', propose: (context: DraftContext) => {
    asked.push(context.ahead);
    return Promise.resolve(new DraftTree([context.tokens[context.tokens.length - 1], 5, 6], [-1, 0, 1], [1, 0.9, 0.8]));
  } };
  const reply = new Reply([1, 2], { maxNewTokens: 8, eosTokenIds: new Set(), constraint: matcher }, drafter);
  reply.step = { root: 3, hidden: new Float32Array(4) };
  reply.context.push(3, 7, 8); // the root, then two tokens the grammar forced after it
  reply.forced = [7, 8];
  const verify = await reply.propose(8);
  assert.deepEqual(asked, [2]);
  assert.deepEqual(verify.tree.tokens, [3, 7, 8, 5, 6]);
  assert.deepEqual(verify.tree.parents, [-1, 0, 1, 2, 3]);
  assert.equal(verify.decided, 3);
  assert.deepEqual([...verify.masks!.keys()], [2, 3, 4]);
  assert.throws(() => DraftTree.chain([3, 7]).graft(DraftTree.rootOnly(9)), /grafted/);
});

test('sampling: the filters in Hugging Face\'s order, and exact acceptance emits the base distribution (chi-square)', () => {
  const base: Sampling = { temperature: 1, topP: 1, topK: 0, repetitionPenalty: 1, seed: 0, acceptance: 'exact' };
  const logits = [0.5, 0.2, 0.15, 0.1, 0.05].map(Math.log);
  const close = (a: Float64Array, b: number[]): void => b.forEach((x, i) => assert.ok(Math.abs(a[i] - x) < 1e-12, `${a[i]} != ${x}`));
  close(distribution(logits, { ...base, topK: 2 }, null), [5 / 7, 2 / 7, 0, 0, 0]);
  close(distribution(logits, { ...base, topP: 0.8 }, null), [0.5, 0.2, 0.15, 0, 0].map((x) => x / 0.85)); // 0.7 < 0.8 <= 0.85
  const penalised = distribution([2, -1, 0.5], { ...base, repetitionPenalty: 2 }, [0, 1]);
  const z = [1, -2, 0.5].map(Math.exp);
  close(penalised, z.map((x) => x / (z[0] + z[1] + z[2]))); // a positive logit halved, a negative one doubled
  assert.equal(pick(Float64Array.from([0, 0.25, 0, 0.5, 0.25]), 0.2499), 1);
  assert.equal(pick(Float64Array.from([0, 0.25, 0, 0.5, 0.25]), 0.25), 3);
  assert.equal(pick(Float64Array.from([0.5, 0.5, 0]), 1 - 2 ** -53), 1);
  assert.equal(splitmix64(0, 0), 0xe220a8397b1dcdafn); // SplitMix64's published first output
  // a tree whose root children are a likely token, an unlikely one and a repeat: the token after the root is p-distributed
  const p = [0.1, 0.2, 0.6, 0.1];
  const rows = Float32Array.from(Array.from({ length: 5 }, () => p.map(Math.log)).flat());
  const tokens = [0, 2, 3, 2, 1];
  const parents = [-1, 0, 0, 0, 1];
  const counts = [0, 0, 0, 0];
  const n = 20000;
  for (let seed = 0; seed < n; seed++) {
    const s = { ...base, seed };
    const [path, root] = acceptExact(tokens, parents, rows, 4, s, 7, []);
    const first = path.length > 1 ? tokens[path[1]] : root;
    counts[first] += 1;
    assert.equal(first, acceptExact([0], [-1], rows.subarray(0, 4), 4, s, 7, [])[1]); // the root alone: the same draw
  }
  const chi2 = counts.reduce((sum, c, i) => sum + (c - n * p[i]) ** 2 / (n * p[i]), 0);
  assert.ok(chi2 < 16.27, `chi-square ${chi2.toFixed(2)} over 3 degrees of freedom (p = 0.001: 16.27)`);
  assert.equal(samplingFor(DEFAULTS, { temperature: 0 }), null);
  assert.deepEqual(samplingFor(null, { temperature: 0.5 }), { ...base, temperature: 0.5, topP: OFF.top_p, topK: OFF.top_k, repetitionPenalty: OFF.repetition_penalty });
  assert.throws(() => samplingFor(null, { temperature: 1, topP: 1.5 }), /top-p must be in \(0, 1\]/);
});

test('largest is the k-th largest value, as a sort would give it (ties and all)', () => {
  let seed = 7;
  const next = (): number => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  for (let trial = 0; trial < 300; trial++) {
    const n = 1 + Math.floor(next() * 300);
    const values = Float64Array.from({ length: n }, () => Math.floor(next() * 20) - 10 + (trial % 2 ? next() : 0));
    const k = 1 + Math.floor(next() * n);
    assert.equal(largest(values, k), Float64Array.from(values).sort()[n - k], `n ${n}, k ${k}`);
  }
});
