/** Node: an artifact folder on disk as an ArtifactSource (graphs opened by path, rows read with pread). */

import { closeSync, openSync, readFileSync, readSync } from 'node:fs';
import { join, resolve } from 'node:path';

import { ArtifactSource, GraphInput } from './source';

export class FolderSource implements ArtifactSource {
  readonly where: string;
  private readonly handles = new Map<string, number>();

  constructor(folder: string) {
    this.where = resolve(folder);
  }

  async readText(file: string): Promise<string> {
    return readFileSync(join(this.where, file), 'utf-8');
  }

  async readBytes(file: string, offset: number, length: number): Promise<Uint8Array> {
    let fd = this.handles.get(file);
    if (fd === undefined) {
      fd = openSync(join(this.where, file), 'r');
      this.handles.set(file, fd);
    }
    const out = new Uint8Array(length);
    const read = readSync(fd, out, 0, length, offset);
    return read === length ? out : out.subarray(0, read);
  }

  async graph(file: string): Promise<GraphInput> {
    return { model: join(this.where, file) }; // ORT reads the external data beside it
  }

  close(): void {
    for (const fd of this.handles.values()) closeSync(fd);
    this.handles.clear();
  }
}
