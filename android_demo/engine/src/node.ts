/** Node: an artifact folder on disk as an ArtifactSource (graphs opened by path, rows read with pread). */

import { closeSync, openSync, readSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';

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
