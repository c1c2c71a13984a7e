/**
 * Where the app keeps its recall store (the engine's recall.ts): one file per artifact in the app's own
 * files dir, /data/data/com.specmemo.chat/files/recall/<artifact>.recall (= RNFS.DocumentDirectoryPath),
 * which Android keeps per app and per device user. A write goes to a partial file beside it, then is
 * renamed over it (rename(2): the old file or the new one, never half of each); a torn file that still
 * reached the name is refused by the store's digest on open and rebuilt. React Native has no
 * crypto.subtle, so the store's SHA-256 is @noble/hashes'.
 */

import { sha256 as nobleSha256 } from '@noble/hashes/sha256';
import { fromByteArray, toByteArray } from 'base64-js';
import RNFS from 'react-native-fs';

import type { Digest, RecallFile } from '@specmemo/engine';

export const RECALL_DIR = `${RNFS.DocumentDirectoryPath}/recall`;

export const digest: Digest = (bytes) => Promise.resolve(nobleSha256(bytes));

export class RecallFileOnPhone implements RecallFile {
  readonly where: string;

  constructor(artifactName: string) {
    this.where = `${RECALL_DIR}/${artifactName}.recall`;
  }

  async read(): Promise<Uint8Array | null> {
    if (!(await RNFS.exists(this.where))) return null; // nothing saved yet
    return toByteArray(await RNFS.readFile(this.where, 'base64'));
  }

  async write(bytes: Uint8Array): Promise<void> {
    if (!(await RNFS.exists(RECALL_DIR))) await RNFS.mkdir(RECALL_DIR);
    const partial = `${this.where}.partial`;
    await RNFS.writeFile(partial, fromByteArray(bytes), 'base64');
    await RNFS.moveFile(partial, this.where);
  }
}
