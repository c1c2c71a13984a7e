/**
 * The controller's verify latency curve, measured on this device at the first reply in auto mode, kept in
 * localStorage for the next visit (as the Python runtime keeps it per artifact and machine): keyed by the
 * artifact, its manifest's digest and the thread count.
 */
import { LatencyCurve } from '@specmemo/engine';

import { manifestDigest, type PickedFolderSource, type UrlSource } from './sources';

const numbers = (value: unknown): value is number[] => Array.isArray(value) && value.every((x) => typeof x === 'number');

export class CurveStore {
  private saved: boolean;

  private constructor(private readonly key: string, readonly curve: LatencyCurve | undefined) {
    this.saved = curve !== undefined;
  }

  /** The store for `opened` at `threads`, with the curve an earlier visit kept (null without Web Crypto). */
  static async open(opened: PickedFolderSource | UrlSource, threads: number): Promise<CurveStore | null> {
    if (typeof crypto?.subtle === 'undefined') return null;
    const digest = await manifestDigest(await opened.readText('manifest.json')).catch(() => null);
    if (digest === null) return null;
    const key = `specmemo curve ${opened.where} ${threads} ${digest}`;
    return new CurveStore(key, CurveStore.read(key));
  }

  private static read(key: string): LatencyCurve | undefined {
    try {
      const kept = (JSON.parse(localStorage.getItem(key) ?? 'null') ?? {}) as { sizes?: unknown; stepMs?: unknown };
      return numbers(kept.sizes) && numbers(kept.stepMs) ? new LatencyCurve(kept.sizes, kept.stepMs) : undefined;
    } catch {
      return undefined; // none, or not a curve: measured again
    }
  }

  /** Keep `curve` once (the first reply in auto mode measured it). */
  keep(curve: LatencyCurve | null): void {
    if (this.saved || !curve) return;
    try {
      localStorage.setItem(this.key, JSON.stringify({ sizes: curve.sizes, stepMs: curve.stepMs }));
    } catch {
      // storage full or refused: measured again next visit
    }
    this.saved = true;
  }
}
