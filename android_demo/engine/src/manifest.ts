/**
 * manifest.json, the contract between the exporter and every runtime (runtime/manifest.py is the
 * Python side). This runtime reads the manifest and nothing else about the model: names, dims,
 * dtypes, capacity, tokenizer, chat template, drafters and tree all come from here.
 *
 * Keys keep the JSON's snake_case so a reader can put this file beside manifest.py. Every check
 * fails with one line that names the fix (ManifestError), before any graph is opened.
 */

import { SHARED } from './shared';
import type { GenerationDefaults } from './sampling';

export const FORMAT_VERSION = SHARED.manifest_format;
export const BYTES_PER_ELEMENT: Record<string, number> = { float32: 4, float16: 2 };

export class ManifestError extends Error {
  override name = 'ManifestError';
}

export interface ModelDims {
  architecture: string;
  vocab_size: number; // V
  hidden_size: number; // h
  intermediate_size: number;
  num_layers: number; // L
  num_heads: number; // H
  num_kv_heads: number; // H_kv
  head_dim: number; // D
  rms_norm_eps: number;
  rope_theta: number;
  max_position_embeddings: number;
  sliding_window?: number; // W (Gemma 3): refused by this runtime for now
}

export interface TensorSpec {
  name: string;
  dtype: string;
  shape: (number | string)[];
}

export interface DecoderIO {
  inputs: TensorSpec[];
  outputs: TensorSpec[];
  inputs_embeds: string;
  position_ids: string;
  attention_bias: string;
  logits_indices: string;
  logits: string;
  next_token_ids: string;
  hidden_states: string;
  kv_pairs: [string, string][]; // (past input, present output) bound to one buffer
  write_position?: string; // [B] int64: where a call's K/V rows go (grouped attention; absent or '': none)
}

/** Embedding rows stored as MatMulNBits stores the tied LM head (see runtime/manifest.py QuantizedRows). */
export interface QuantizedRows {
  bits: 4 | 8;
  block_size: number;
  zero_point: number;
  values_offset: number;
  scales_offset: number;
  scales_dtype: 'float32' | 'float16';
  minimums_offset?: number | null; // float32 per block, added after the scale (Q4_1 / Q4_K blocks)
  scale_group?: number; // > 0: scales and minimums factored, per row nb/G float16 d then nb uint8 c, d[b / G] · c[b]
}

export interface EmbeddingInfo {
  file: string;
  dtype: string;
  shape: [number, number]; // [V, h]
  quantized: QuantizedRows | null;
}

export interface TokenizerInfo {
  file: string;
  eos_token_ids: number[];
  bos_token_id: number | null;
  chat_template: string | null;
  add_bos_token: boolean;
}

export interface SharedInitializer {
  decoder_name: string;
  heads_name: string;
  file: string;
  offset: number;
  shape: number[];
  dtype: string;
}

export interface HeadsInfo {
  file: string;
  data_file: string;
  hidden: string; // input [B, h]
  token_ids: string; // output [B, K, k] int64
  probs: string; // output [B, K, k]
  num_heads: number; // K
  top_k: number; // k
  mode: string;
  tree: number[][]; // Medusa choices, parents first
  accuracy?: number[][]; // [K][k] cumulative top-1..top-k accuracy (eval-heads); absent or [] without one
  shared_lm_head: SharedInitializer | null;
}

/** The feature drafter's graph (runtime/graphs.py FeatureDrafterInfo). */
export interface FeatureDrafterInfo {
  file: string;
  data_file: string;
  inputs: string[]; // features, embeds, position_ids, attention_bias, past_key, past_value
  outputs: string[]; // features_out, top_ids, top_probs, present_key, present_value
  top_k: number;
  capacity: number; // C_d rows of its KV buffer
  depth?: number; // depths drafted at most (2 when absent, as in manifests written before the key)
  width?: number; // nodes expanded per further depth (4 when absent)
}

export interface DevicePlan {
  profile: string;
  budget: number;
  capacity: number; // C
  rows: number; // R
  tree: number; // T_max
}

export interface OrtFormatInfo {
  files: string[];
  required_operators: string;
  target_platform: string;
  operators: string[];
  embedding: EmbeddingInfo | null;
}

/** The decoder with its K/V buffers as inputs only (runtime/graphs.py RowsGraph): a call's new K/V rows come out as
 * one output [2·layers, H_kv, T, D] in kv_pairs order, which the runtime writes into its buffers itself. */
export interface RowsGraph {
  file: string; // reads the decoder's data file
  kv_rows: string;
}

export interface Manifest {
  format_version: number;
  source_model: string;
  dims: ModelDims;
  weight_dtype: string;
  kv_dtype: 'float32' | 'float16';
  activation_dtype: 'float32' | 'float16';
  max_capacity: number;
  decoder_file: string;
  decoder_data_file: string;
  io: DecoderIO;
  embedding: EmbeddingInfo;
  tokenizer: TokenizerInfo;
  drafter: string;
  heads: HeadsInfo | null;
  feature_drafter: FeatureDrafterInfo | null;
  plan: DevicePlan | null;
  min_step_rows: number;
  step_row_multiple?: number; // rows per call rounded up to this (1 when absent)
  draft_shape: 'tree' | 'chain';
  ort_format: OrtFormatInfo | null;
  attention?: 'gqa' | 'grouped'; // the decoder's attention (runtime/span.py; 'gqa' when absent)
  span_bucket?: number; // a call attends to S rounded up to this many positions (1 when absent)
  generation: GenerationDefaults | null; // the sampling settings replies start from (temperature 0: greedy)
  rows_graph: RowsGraph | null; // absent in artifacts exported before it (the decoder's presents are bound then)
}

/** L: the bias's columns for a call attending to `attended` of `capacity` positions (runtime/span.py span). */
export function span(attended: number, capacity: number, bucket: number): number {
  return Math.min(Math.ceil(attended / bucket) * bucket, Math.max(capacity, attended));
}

export type ModelFormat = 'onnx' | 'ort';

function need(condition: boolean, message: string): void {
  if (!condition) throw new ManifestError(message);
}

/** Parse and check manifest.json's text; `where` names the file in messages. */
/** Rows every call runs at least, and a multiple of (runtime/row_route.py RowRoute). */
export interface RowRoute {
  minRows: number;
  multiple: number;
}

/** The exporter's default route, as the manifest says it. */
export function manifestRoute(m: Manifest): RowRoute {
  return { minRows: m.min_step_rows, multiple: m.step_row_multiple ?? 1 };
}

export function parseManifest(text: string, where: string): Manifest {
  let data: Record<string, unknown>;
  try {
    data = JSON.parse(text) as Record<string, unknown>;
  } catch (err) {
    throw new ManifestError(`${where} is not valid JSON (${(err as Error).message}): re-export the artifact`);
  }
  need(typeof data === 'object' && data !== null, `${where} is not a JSON object: re-export the artifact`);
  need(data.format_version === FORMAT_VERSION,
    `manifest format ${String(data.format_version)} is not ${FORMAT_VERSION}: re-export with this version of specmemo`);
  for (const key of ['dims', 'io', 'embedding', 'tokenizer', 'max_capacity', 'kv_dtype', 'activation_dtype', 'decoder_file']) {
    need(key in data, `${where} has no "${key}": re-export the artifact`);
  }
  const m = {
    drafter: '', heads: null, feature_drafter: null, plan: null, min_step_rows: 2, draft_shape: 'tree', ort_format: null,
    generation: null, rows_graph: null, ...data,
  } as unknown as Manifest;
  const d = m.dims;
  for (const key of ['vocab_size', 'hidden_size', 'intermediate_size', 'num_layers', 'num_heads', 'num_kv_heads', 'head_dim'] as const) {
    need(Number.isInteger(d[key]) && d[key] > 0, `dims.${key} must be a positive integer, got ${String(d[key])}`);
  }
  need(d.num_heads % d.num_kv_heads === 0, `num_heads ${d.num_heads} is not a multiple of num_kv_heads ${d.num_kv_heads}`);
  need(m.max_capacity > 0, `max_capacity must be positive, got ${m.max_capacity}`);
  for (const key of ['kv_dtype', 'activation_dtype'] as const) {
    need(m[key] in BYTES_PER_ELEMENT, `${key} ${JSON.stringify(m[key])} is not float32 or float16: re-export with this version of specmemo`);
  }
  need(m.activation_dtype === 'float32', `activation_dtype ${m.activation_dtype}: this runtime reads float32 activations; re-export with the default`);
  need(m.draft_shape === 'tree' || m.draft_shape === 'chain', `draft_shape ${JSON.stringify(m.draft_shape)} is not tree or chain: re-export the artifact`);
  need(m.min_step_rows >= 1, `min_step_rows must be at least 1, got ${m.min_step_rows}: re-export the artifact`);
  need([undefined, 1, 2].includes(m.step_row_multiple), `step_row_multiple ${m.step_row_multiple} is not 1 or 2: re-export the artifact`);
  need(!d.sliding_window, `${m.source_model} has sliding-window layers (Gemma 3): this runtime does not run them yet; ` +
    'use the Python runtime (specmemo chat)');
  need(m.io.kv_pairs.length === 2 * d.num_layers, `io.kv_pairs has ${m.io.kv_pairs.length} pairs, expected 2 x ${d.num_layers} layers`);
  need(m.embedding.shape[0] === d.vocab_size && m.embedding.shape[1] === d.hidden_size,
    `embedding.shape [${m.embedding.shape.join(', ')}] is not [V, h] = [${d.vocab_size}, ${d.hidden_size}]: re-export the artifact`);
  if (m.heads !== null) {
    for (const choice of m.heads.tree) {
      need(choice.length <= m.heads.num_heads && Math.max(...choice) < m.heads.top_k,
        `heads.tree: choice [${choice.join(', ')}] needs more than ${m.heads.num_heads} heads or rank >= top_k ${m.heads.top_k}: re-export the artifact`);
    }
  }
  need(m.rows_graph === null || (typeof m.rows_graph.file === 'string' && typeof m.rows_graph.kv_rows === 'string'),
    `rows_graph must name its file and kv_rows output: re-export the artifact`);
  const g = m.generation;
  if (g !== null) {
    need(g.temperature >= 0 && g.top_p > 0 && g.top_p <= 1 && g.top_k >= 0 && g.repetition_penalty > 0,
      `generation: temperature ${g.temperature}, top_p ${g.top_p}, top_k ${g.top_k}, repetition_penalty ${g.repetition_penalty} are out of range: re-export the artifact`);
  }
  if (m.plan !== null) {
    need(m.plan.capacity <= m.max_capacity, `plan.capacity ${m.plan.capacity} exceeds the graph's max capacity ${m.max_capacity}: re-export with --profile`);
    need(m.plan.tree <= m.plan.rows, `plan.tree ${m.plan.tree} exceeds plan.rows ${m.plan.rows}: re-export with --profile`);
  }
  return m;
}

/** The file a runtime loads for the graph `onnxFile` in `format` (runtime/manifest.py graph_file). */
export function graphFile(m: Manifest, onnxFile: string, format: ModelFormat): string {
  if (format === 'onnx') return onnxFile;
  const ortFile = onnxFile.replace(/\.onnx$/, '.ort');
  if (m.ort_format === null || !m.ort_format.files.includes(ortFile)) {
    throw new ManifestError(`the artifact has no ${ortFile}: re-export it with --mobile, or load the ONNX files (modelFormat 'onnx')`);
  }
  return ortFile;
}

/** The decoder graph the engine runs, as an .onnx name (graphFile maps it for `format`): the rows graph where the
 * artifact has one and the format is ONNX (an .ort set has the decoder only), else the decoder. */
export function decoderGraph(m: Manifest, format: ModelFormat): string {
  return format === 'onnx' && m.rows_graph !== null ? m.rows_graph.file : m.decoder_file;
}

/** The graph's external data files for `format` (an .ort graph carries its weights inside). */
export function graphDataFiles(m: Manifest, onnxFile: string, format: ModelFormat): string[] {
  if (format === 'ort') return [];
  if (onnxFile === m.decoder_file || onnxFile === m.rows_graph?.file) return [m.decoder_data_file];
  const heads = m.heads;
  if (heads !== null && onnxFile === heads.file) {
    return heads.shared_lm_head === null ? [heads.data_file] : [heads.data_file, heads.shared_lm_head.file];
  }
  const drafter = m.feature_drafter;
  if (drafter !== null && onnxFile === drafter.file) return [drafter.data_file];
  return [];
}

/** Where token rows are read: the .ort set carries the LM head's rows itself (runtime/manifest.py embedding_for). */
export function embeddingFor(m: Manifest, format: ModelFormat): EmbeddingInfo {
  const ort = m.ort_format;
  return format === 'ort' && ort !== null && ort.embedding !== null ? ort.embedding : m.embedding;
}

export function bytesPerKvElement(m: Manifest): number {
  return BYTES_PER_ELEMENT[m.kv_dtype];
}

export function bytesPerActivation(m: Manifest): number {
  return BYTES_PER_ELEMENT[m.activation_dtype];
}

/** The depths the feature drafter drafts and the nodes it expands per depth (graphs.py FeatureDrafterInfo: 2 and 4
 * in manifests written before the keys). */
export function featureShape(f: FeatureDrafterInfo): { depth: number; width: number } {
  return { depth: f.depth ?? 2, width: f.width ?? 4 };
}

/** KV rows the feature drafter keeps beyond the decoder's C for its draft tree: `width` per depth (graphs.py
 * scratch_slots). */
export function scratchSlots(f: FeatureDrafterInfo): number {
  const { depth, width } = featureShape(f);
  return depth * width;
}
