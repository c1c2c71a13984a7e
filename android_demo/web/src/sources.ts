/**
 * The page's two ArtifactSources: a folder the user picked (<input type="file" webkitdirectory>) and
 * a base URL the page fetches files from (`?artifact=<url>`). The engine asks only for text, byte
 * ranges and graphs; the graphs go to onnxruntime-web as bytes with their external data beside them.
 */
import type { ArtifactSource, GraphInput } from '@specmemo/engine';

/** Bytes of one file arriving: `loaded` of `total` (total is null when the server sends no length);
 * `cached`: read from the browser's Cache Storage, not the network. */
export interface Progress {
  file: string;
  loaded: number;
  total: number | null;
  cached?: boolean;
}
export type ProgressListener = (progress: Progress) => void;

/** What names an artifact's version in the browser's storage: the SHA-256 of its manifest.json (16 hex digits). */
export async function manifestDigest(manifest: string): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(manifest))).slice(0, 8);
  return [...digest].map((b) => b.toString(16).padStart(2, '0')).join('');
}

function slice(bytes: Uint8Array, file: string, offset: number, length: number): Uint8Array {
  if (!Number.isInteger(offset) || !Number.isInteger(length) || offset < 0 || length < 0) {
    throw new Error(`readBytes(${file}, ${offset}, ${length}): offset and length must be whole numbers >= 0`);
  }
  return bytes.subarray(Math.min(offset, bytes.length), Math.min(offset + length, bytes.length));
}

/** A data file named either by its bare name or by a path relative to the artifact (same thing here). */
function dataName(file: string): string {
  return file.replace(/^\.\//, '');
}

// ---------------------------------------------------------------------------------------------------
// A picked folder

/**
 * Over the files of a picked folder. Files are matched by their path inside the folder that holds
 * manifest.json (so picking the artifact folder itself or its parent both work). Byte ranges (the
 * engine reads a few embedding rows every step) come from 1 MiB blocks read with File.slice and kept
 * in a small LRU cache (64 MiB at most): one File read per row would be slow.
 */
export class PickedFolderSource implements ArtifactSource {
  readonly where: string;
  private readonly files: Map<string, File>;
  private readonly blocks = new Map<string, Promise<Uint8Array>>(); // `${file}@${index}`, oldest first

  static readonly BLOCK_BYTES = 1 << 20;
  static readonly MAX_BLOCKS = 64;

  constructor(list: FileList | readonly File[]) {
    const all = Array.from(list);
    const path = (f: File) => (f.webkitRelativePath || f.name).split('/');
    const manifests = all.filter((f) => path(f).at(-1) === 'manifest.json').sort((a, b) => path(a).length - path(b).length);
    if (manifests.length === 0) {
      throw new Error('the picked folder has no manifest.json: pick the artifact folder that `specmemo export` wrote');
    }
    const root = path(manifests[0]).slice(0, -1); // the folder that holds manifest.json
    this.where = root.join('/') || '(picked folder)';
    this.files = new Map();
    for (const f of all) {
      const parts = path(f);
      if (parts.length > root.length && root.every((p, i) => parts[i] === p)) {
        this.files.set(parts.slice(root.length).join('/'), f);
      }
    }
  }

  private file(name: string): File {
    const f = this.files.get(dataName(name));
    if (!f) throw new Error(`${this.where}: no file ${name} in the picked folder`);
    return f;
  }

  async readText(file: string): Promise<string> {
    return this.file(file).text();
  }

  size(file: string): Promise<number> {
    return new Promise((done) => done(this.file(file).size)); // a file not picked rejects, as in readText
  }

  private block(name: string, f: File, index: number): Promise<Uint8Array> {
    const key = `${name}@${index}`;
    let bytes = this.blocks.get(key);
    if (bytes) {
      this.blocks.delete(key); // most recently used goes last
    } else {
      const start = index * PickedFolderSource.BLOCK_BYTES;
      bytes = f.slice(start, Math.min(start + PickedFolderSource.BLOCK_BYTES, f.size)).arrayBuffer().then((b) => new Uint8Array(b));
      bytes.catch(() => this.blocks.delete(key));
      if (this.blocks.size >= PickedFolderSource.MAX_BLOCKS) this.blocks.delete(this.blocks.keys().next().value as string);
    }
    this.blocks.set(key, bytes);
    return bytes;
  }

  async readBytes(file: string, offset: number, length: number): Promise<Uint8Array> {
    const f = this.file(file);
    slice(new Uint8Array(0), file, offset, length); // argument check only
    const end = Math.min(offset + length, f.size);
    if (offset >= end) return new Uint8Array(0);
    const size = PickedFolderSource.BLOCK_BYTES;
    const out = new Uint8Array(end - offset);
    for (let index = Math.floor(offset / size); index * size < end; index++) {
      const block = await this.block(dataName(file), f, index);
      const from = Math.max(offset, index * size);
      const to = Math.min(end, (index + 1) * size);
      out.set(block.subarray(from - index * size, to - index * size), from - offset);
    }
    return out;
  }

  async graph(file: string, dataFiles: readonly string[] | string | null): Promise<GraphInput> {
    const model = new Uint8Array(await this.file(file).arrayBuffer());
    const names = dataFiles == null ? [] : typeof dataFiles === 'string' ? [dataFiles] : dataFiles;
    const externalData = await Promise.all(
      names.map(async (path) => ({ path, data: new Uint8Array(await this.file(path).arrayBuffer()) })),
    );
    return names.length ? { model, externalData } : { model };
  }
}

// ---------------------------------------------------------------------------------------------------
// A URL

/**
 * Over a base URL (`?artifact=/artifact/` or an absolute URL that allows CORS). Every file read as
 * bytes is downloaded once, with progress, and kept: the engine reads embedding rows (and a shared
 * LM head) out of the data files after the graphs were made from them, and those reads slice the
 * cached bytes instead of fetching again. Graph files (.onnx/.ort) are not kept.
 *
 * Across visits every file but manifest.json is kept in the browser's Cache Storage, in a cache named
 * by the base URL and a digest of the manifest: a second visit reads the model from disk, nothing over
 * the network; a re-exported artifact (another manifest) gets a fresh cache and the old one is deleted.
 */
export class UrlSource implements ArtifactSource {
  readonly where: string;
  private readonly base: URL;
  private readonly cache = new Map<string, Promise<Uint8Array>>();
  private store: Promise<Cache | null> | null = null;
  private manifest: Promise<string> | null = null;
  static readonly CACHE_PREFIX = 'specmemo ';

  constructor(base: string, private readonly onProgress: ProgressListener = () => {}, relativeTo = location.href) {
    this.base = new URL(base.endsWith('/') ? base : `${base}/`, relativeTo);
    this.where = this.base.href;
  }

  url(file: string): string {
    return new URL(dataName(file), this.base).href;
  }

  private async fetchOk(file: string): Promise<Response> {
    const url = this.url(file);
    let response: Response;
    try {
      response = await fetch(url);
    } catch (error) {
      throw new Error(`${url}: ${(error as Error).message}`);
    }
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status} ${response.statusText}`.trim());
    return response;
  }

  async readText(file: string): Promise<string> {
    if (dataName(file) === 'manifest.json') { // always from the network: it names the cache
      this.manifest ??= this.fetchOk(file).then((r) => r.text());
      this.manifest.catch(() => { this.manifest = null; });
      return this.manifest;
    }
    return new TextDecoder().decode(await this.download(file));
  }

  /** A file's bytes without reading it: from the cache, else the server's Content-Length (HEAD). */
  async size(file: string): Promise<number | null> {
    const store = await this.storeFor();
    const hit = store ? await store.match(this.url(file)).catch(() => undefined) : undefined;
    const length = (hit ?? await fetch(this.url(file), { method: 'HEAD' }).catch(() => null))?.headers.get('Content-Length');
    return length ? Number(length) : null;
  }

  /** This artifact's cache (null where the browser has none: an insecure origin, or storage refused). */
  private storeFor(): Promise<Cache | null> {
    this.store ??= (async () => {
      if (typeof caches === 'undefined' || typeof crypto?.subtle === 'undefined') return null;
      const prefix = `${UrlSource.CACHE_PREFIX}${this.base.href} `;
      const name = prefix + await manifestDigest(await this.readText('manifest.json'));
      for (const old of await caches.keys()) if (old.startsWith(prefix) && old !== name) await caches.delete(old);
      return caches.open(name);
    })().catch(() => null);
    return this.store;
  }

  /** The whole file, streamed with progress: from the browser's cache when a visit before kept it. */
  async download(file: string): Promise<Uint8Array> {
    const store = await this.storeFor();
    const hit = store ? await store.match(this.url(file)).catch(() => undefined) : undefined;
    const bytes = await this.read(file, hit ?? await this.fetchOk(file), hit !== undefined);
    if (store && !hit) { // a full quota leaves the page working, uncached
      const headers = { 'Content-Type': 'application/octet-stream', 'Content-Length': String(bytes.length) };
      await store.put(this.url(file), new Response(bytes as Uint8Array<ArrayBuffer>, { headers })).catch(() => {});
    }
    return bytes;
  }

  private async read(file: string, response: Response, cached: boolean): Promise<Uint8Array> {
    const header = response.headers.get('Content-Length');
    // A compressed response's length is not the body's: then progress counts bytes without a total.
    const total = header !== null && !response.headers.get('Content-Encoding') ? Number(header) : null;
    this.onProgress({ file, loaded: 0, total, cached });
    if (!response.body) {
      const bytes = new Uint8Array(await response.arrayBuffer());
      this.onProgress({ file, loaded: bytes.length, total: bytes.length, cached });
      return bytes;
    }
    const reader = response.body.getReader();
    let bytes = new Uint8Array(total ?? 1 << 20);
    let loaded = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (loaded + value.length > bytes.length) { // no or wrong length: grow
        const bigger = new Uint8Array(Math.max(bytes.length * 2, loaded + value.length));
        bigger.set(bytes.subarray(0, loaded));
        bytes = bigger;
      }
      bytes.set(value, loaded);
      loaded += value.length;
      this.onProgress({ file, loaded, total, cached });
    }
    this.onProgress({ file, loaded, total: loaded, cached });
    return loaded === bytes.length ? bytes : bytes.slice(0, loaded);
  }

  /** The file's bytes, downloaded at most once (a failed download is not kept). */
  private kept(file: string): Promise<Uint8Array> {
    const key = dataName(file);
    let bytes = this.cache.get(key);
    if (!bytes) {
      bytes = this.download(key);
      this.cache.set(key, bytes);
      bytes.catch(() => this.cache.delete(key));
    }
    return bytes;
  }

  async readBytes(file: string, offset: number, length: number): Promise<Uint8Array> {
    return slice(await this.kept(file), file, offset, length);
  }

  async graph(file: string, dataFiles: readonly string[] | string | null): Promise<GraphInput> {
    const names = dataFiles == null ? [] : typeof dataFiles === 'string' ? [dataFiles] : dataFiles;
    const [model, ...data] = await Promise.all([this.download(file), ...names.map((name) => this.kept(name))]);
    return names.length ? { model, externalData: names.map((path, i) => ({ path, data: data[i] })) } : { model };
  }
}
