/**
 * Artifacts on the phone: folders the user copied (adb push) into the app's external files dir,
 *   /sdcard/Android/data/com.specmemo.chat/files/artifacts/<name>/  (= RNFS.ExternalDirectoryPath)
 * read with react-native-fs. The engine asks an ArtifactSource for text (manifest, tokenizer),
 * byte ranges (embedding rows, one token at a time) and a graph to open (a path: ONNX Runtime
 * native opens the file and its external data beside it, so no weights cross the bridge).
 */

import { toByteArray } from 'base64-js';
import RNFS from 'react-native-fs';

import type { ArtifactSource, GraphInput } from '@specmemo/engine';

export const ARTIFACTS_DIR = `${RNFS.ExternalDirectoryPath}/artifacts`;

export interface ArtifactEntry {
  name: string;
  path: string;
  problem: string | null; // why it cannot be opened, else null
  hasOrt: boolean; // an `export --mobile` artifact: .ort graphs listed in manifest.ort_format
}

/** The folders under ARTIFACTS_DIR (created if missing), each with a first look at its manifest. */
export async function listArtifacts(dir: string = ARTIFACTS_DIR): Promise<ArtifactEntry[]> {
  if (!(await RNFS.exists(dir))) await RNFS.mkdir(dir);
  const entries: ArtifactEntry[] = [];
  for (const item of await RNFS.readDir(dir)) {
    if (!item.isDirectory()) continue;
    const entry: ArtifactEntry = { name: item.name, path: item.path, problem: null, hasOrt: false };
    try {
      const manifest = JSON.parse(await RNFS.readFile(`${item.path}/manifest.json`, 'utf8')) as {
        ort_format?: { files?: string[] } | null;
      };
      entry.hasOrt = (manifest.ort_format?.files?.length ?? 0) > 0;
    } catch {
      entry.problem = 'no readable manifest.json';
    }
    entries.push(entry);
  }
  return entries.sort((a, b) => a.name.localeCompare(b.name));
}

/**
 * react-native-fs 2.20's read() opens a stream per call and leaves closing it to the garbage
 * collector, and the engine reads one embedding row (two ranges when quantized) per token: rows
 * already read are kept, up to CACHE_BYTES, so a repeated token costs no file descriptor.
 */
const CACHE_BYTES = 8 * 2 ** 20;

export class DeviceSource implements ArtifactSource {
  private readonly cache = new Map<string, Uint8Array>(); // insertion order = least recently used first
  private cached = 0;

  constructor(readonly where: string) {}

  private path(file: string): string {
    return `${this.where}/${file}`;
  }

  readText(file: string): Promise<string> {
    return RNFS.readFile(this.path(file), 'utf8');
  }

  async readBytes(file: string, offset: number, length: number): Promise<Uint8Array> {
    if (length <= 0) return new Uint8Array(0);
    if (offset + length > 2 ** 31 - 1) {
      throw new RangeError(`${file}: byte ${offset + length} is past 2 GiB, which react-native-fs 2.20 cannot seek to`);
    }
    const key = `${file}:${offset}:${length}`;
    const hit = this.cache.get(key);
    if (hit !== undefined) {
      this.cache.delete(key); // most recently used again
      this.cache.set(key, hit);
      return hit;
    }
    const bytes = toByteArray(await RNFS.read(this.path(file), length, offset, 'base64'));
    this.cache.set(key, bytes);
    this.cached += bytes.length;
    for (const [old, value] of this.cache) {
      if (this.cached <= CACHE_BYTES) break;
      this.cache.delete(old);
      this.cached -= value.length;
    }
    return bytes;
  }

  async graph(file: string, dataFiles: readonly string[]): Promise<GraphInput> {
    for (const name of [file, ...dataFiles]) {
      if (!(await RNFS.exists(this.path(name)))) {
        throw new Error(`${name} is missing in ${this.where}: push the whole artifact folder again`);
      }
    }
    return { model: this.path(file) };
  }
}
