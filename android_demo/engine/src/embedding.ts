/**
 * The token embedding table [V, h], read from the artifact one row per token (runtime/embedding.py):
 * the decoder graph takes embeddings, not ids, so the table is neither loaded nor mapped.
 * Quantized artifacts keep no table of their own: a row is the tied LM head's MatMulNBits row in the
 * decoder's data file (values, then scales), dequantized x = scale · (q − zero point) in float32,
 * the arithmetic the exporter checked; an untied model's are its GGUF embedding blocks (+ a per-block minimum).
 */

import { EmbeddingInfo, ManifestError, QuantizedRows } from './manifest';
import { ArtifactSource } from './source';

/** IEEE half → float (exact). */
export function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

export class EmbeddingTable {
  readonly vocabSize: number; // V
  readonly hiddenSize: number; // h
  private readonly rowBytes: number;
  private readonly blocks: number; // per row (quantized)
  private readonly scaleBytes: number; // per row (quantized)

  constructor(private readonly source: ArtifactSource, private readonly info: EmbeddingInfo) {
    [this.vocabSize, this.hiddenSize] = info.shape;
    const q = info.quantized;
    if (q === null) {
      if (info.dtype !== 'float32') throw new ManifestError(`embedding dtype ${info.dtype}: this runtime reads float32 rows; re-export the artifact`);
      this.rowBytes = 4 * this.hiddenSize;
      this.blocks = 0;
      this.scaleBytes = 0;
    } else {
      this.rowBytes = (this.hiddenSize * q.bits) / 8;
      this.blocks = this.hiddenSize / q.block_size;
      const group = q.scale_group ?? 0;
      if (group && this.blocks % group) throw new ManifestError(`embedding.quantized: ${this.blocks} blocks a row are not groups of ${group}: re-export the artifact`);
      this.scaleBytes = group ? 2 * (this.blocks / group) + this.blocks : this.blocks * (q.scales_dtype === 'float16' ? 2 : 4);
    }
  }

  /** Rows of `tokens` into `out` [T, h] (an arena view). */
  async lookup(tokens: ArrayLike<number | bigint>, out: Float32Array): Promise<void> {
    const h = this.hiddenSize;
    for (let i = 0; i < tokens.length; i++) {
      const token = Number(tokens[i]);
      if (!(Number.isInteger(token) && token >= 0 && token < this.vocabSize)) {
        throw new RangeError(`token id ${token} is outside the vocabulary of ${this.vocabSize}`);
      }
      const row = out.subarray(i * h, (i + 1) * h);
      const q = this.info.quantized;
      if (q === null) {
        const bytes = await this.read(token * this.rowBytes, this.rowBytes);
        new Uint8Array(row.buffer, row.byteOffset, this.rowBytes).set(bytes);
      } else {
        await this.dequantize(token, q, row);
      }
    }
  }

  private async read(offset: number, length: number): Promise<Uint8Array> {
    const bytes = await this.source.readBytes(this.info.file, offset, length);
    if (bytes.length !== length) throw new ManifestError(`${this.info.file} ended early at byte ${offset}: re-export the artifact`);
    return bytes;
  }

  /** One row's per-block floats at `offset`: `dtype` as stored, or factored d · c (QuantizedRows.scale_group). */
  private async perBlock(offset: number, q: QuantizedRows, bytes: number, dtype: 'float32' | 'float16'): Promise<Float32Array> {
    const raw = await this.read(offset, bytes);
    const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
    const out = new Float32Array(this.blocks);
    const group = q.scale_group ?? 0;
    for (let b = 0; b < this.blocks; b++) {
      if (group) {
        const groups = this.blocks / group;
        out[b] = halfToFloat(view.getUint16(2 * Math.floor(b / group), true)) * raw[2 * groups + b]; // exact in float32
      } else {
        out[b] = dtype === 'float16' ? halfToFloat(view.getUint16(2 * b, true)) : view.getFloat32(4 * b, true);
      }
    }
    return out;
  }

  private async dequantize(token: number, q: QuantizedRows, row: Float32Array): Promise<void> {
    const values = await this.read(q.values_offset + token * this.rowBytes, this.rowBytes);
    const scales = await this.perBlock(q.scales_offset + token * this.scaleBytes, q, this.scaleBytes, q.scales_dtype);
    const hasMinimums = q.minimums_offset !== undefined && q.minimums_offset !== null;
    const minimumBytes = q.scale_group ? this.scaleBytes : 4 * this.blocks;
    const minimums = hasMinimums ? await this.perBlock(q.minimums_offset! + token * minimumBytes, q, minimumBytes, 'float32') : null;
    const block = q.block_size;
    for (let b = 0; b < this.blocks; b++) {
      const scale = scales[b];
      const minimum = minimums ? minimums[b] : 0;
      for (let j = 0; j < block; j++) {
        const at = b * block + j;
        const value = q.bits === 8 ? values[at] : at % 2 === 0 ? values[at >> 1] & 0x0f : values[at >> 1] >> 4;
        const scaled = Math.fround((value - q.zero_point) * scale); // one float32 rounding, as numpy's multiply
        row[at] = minimums ? scaled + minimum : scaled; // the float32 store rounds the sum, as numpy's add
      }
    }
  }
}
