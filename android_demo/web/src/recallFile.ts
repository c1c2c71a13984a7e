/**
 * Where the page keeps its recall store (the engine's recall.ts): IndexedDB, one record per artifact location,
 * written in one transaction, so a record is whole or the old one stays (a tab closed mid-write loses the
 * newest turn, never the store). The browser keeps IndexedDB per origin and profile: each site and each user
 * of the browser has their own store; `?recall=on` turns it on, the Forget button empties it.
 */
import type { RecallFile } from '@specmemo/engine';

const DATABASE = 'specmemo-recall';
const TABLE = 'stores';

function database(): Promise<IDBDatabase> {
  return new Promise((resolve, reject) => {
    const request = indexedDB.open(DATABASE, 1);
    request.onupgradeneeded = () => request.result.createObjectStore(TABLE);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(new Error(`IndexedDB ${DATABASE}: ${request.error?.message ?? 'cannot be opened'}`));
  });
}

function done(transaction: IDBTransaction): Promise<void> {
  return new Promise((resolve, reject) => {
    transaction.oncomplete = () => resolve();
    transaction.onerror = transaction.onabort = () =>
      reject(new Error(`IndexedDB ${DATABASE}: ${transaction.error?.message ?? 'the write was aborted'}`));
  });
}

export class RecallFileInIndexedDB implements RecallFile {
  readonly where: string;

  constructor(private readonly key: string) {
    this.where = `IndexedDB ${DATABASE}/${key}`;
  }

  async read(): Promise<Uint8Array | null> {
    const db = await database();
    try {
      const request = db.transaction(TABLE).objectStore(TABLE).get(this.key);
      const value = await new Promise<unknown>((resolve, reject) => {
        request.onsuccess = () => resolve(request.result);
        request.onerror = () => reject(new Error(`${this.where}: ${request.error?.message ?? 'cannot be read'}`));
      });
      if (value instanceof Uint8Array) return value;
      return value instanceof ArrayBuffer ? new Uint8Array(value) : null; // nothing saved yet (or not bytes: rebuilt)
    } finally {
      db.close();
    }
  }

  async write(bytes: Uint8Array): Promise<void> {
    const db = await database();
    try {
      const transaction = db.transaction(TABLE, 'readwrite');
      transaction.objectStore(TABLE).put(bytes.slice(), this.key); // a copy: the caller may reuse its buffer
      await done(transaction);
    } finally {
      db.close();
    }
  }
}
