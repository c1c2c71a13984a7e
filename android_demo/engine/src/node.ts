/** Node: an artifact folder on disk as an ArtifactSource (graphs opened by path, rows read with pread); a recall
 * store's file, written whole or not at all. */

import { closeSync, openSync, readFileSync, readSync } from 'node:fs';
import Module from 'node:module';
import { mkdir, open, readFile, rename } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';

import type { XGrammar } from './constraint';
import { RecallFile } from './recallStore';
import { ArtifactSource, GraphInput } from './source';

/** `work` done now, its result or its throw handed over as a promise: synchronous reads behind the async interface. */
const settled = <T>(work: () => T): Promise<T> => new Promise((done) => done(work()));

export class FolderSource implements ArtifactSource {
  readonly where: string;
  private readonly handles = new Map<string, number>();

  constructor(folder: string) {
    this.where = resolve(folder);
  }

  readText(file: string): Promise<string> {
    return readFile(join(this.where, file), 'utf-8');
  }

  /** A synchronous pread on a kept descriptor: the rows a step needs, read on the spot (no thread-pool hop). */
  readBytes(file: string, offset: number, length: number): Promise<Uint8Array> {
    return settled(() => this.pread(file, offset, length));
  }

  private pread(file: string, offset: number, length: number): Uint8Array {
    let fd = this.handles.get(file);
    if (fd === undefined) {
      fd = openSync(join(this.where, file), 'r');
      this.handles.set(file, fd);
    }
    const out = new Uint8Array(length);
    const read = readSync(fd, out, 0, length, offset);
    return read === length ? out : out.subarray(0, read);
  }

  graph(file: string): Promise<GraphInput> {
    return settled(() => ({ model: join(this.where, file) })); // ORT reads the external data beside it
  }

  close(): void {
    for (const fd of this.handles.values()) closeSync(fd);
    this.handles.clear();
  }
}

/** A recall store kept in a file: written to a temporary file beside it, flushed to disk, renamed over it (a killed
 * process leaves the old file or the new one, never half of one: runtime/recall_store.py save). */
export class RecallFileOnDisk implements RecallFile {
  readonly where: string;

  constructor(path: string) {
    this.where = resolve(path);
  }

  async read(): Promise<Uint8Array | null> {
    try {
      return new Uint8Array(await readFile(this.where));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
      throw err;
    }
  }

  async write(bytes: Uint8Array): Promise<void> {
    await mkdir(dirname(this.where), { recursive: true });
    const partial = join(dirname(this.where), `.${basename(this.where)}.${process.pid}.partial`);
    const handle = await open(partial, 'w');
    try {
      await handle.writeFile(bytes);
      await handle.sync();
    } finally {
      await handle.close();
    }
    await rename(partial, this.where);
  }
}

/**
 * xgrammar's WebAssembly build for Node (structured output: constraint.ts). Its package says `"type": "module"` but
 * ships a UMD bundle that calls `require`, which Node's ES-module loader refuses: it is compiled here as the
 * CommonJS module it is.
 */
export function loadXGrammar(): XGrammar {
  const file = require.resolve('@mlc-ai/web-xgrammar/lib/index.js');
  const loaded = new Module(file, module);
  loaded.filename = file;
  loaded.paths = (Module as unknown as { _nodeModulePaths(dir: string): string[] })._nodeModulePaths(dirname(file));
  (loaded as unknown as { _compile(code: string, file: string): void })._compile(readFileSync(file, 'utf-8'), file);
  return loaded.exports as XGrammar;
}
