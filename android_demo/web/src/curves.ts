/**
 * What the engine measures on this device, kept in localStorage for the next visit (as the Python runtime keeps it
 * per artifact and machine): the numeric route probed at open, and the controller's verify latency curve, measured
 * at the first reply in auto mode. Keyed by the artifact, its manifest's digest and the thread count.
 */
import { LatencyCurve, type RowRoute } from '@specmemo/engine';

import { manifestDigest, type PickedFolderSource, type UrlSource } from './sources';

const numbers = (value: unknown): value is number[] => Array.isArray(value) && value.every((x) => typeof x === 'number');

export class CurveStore {
  private saved: boolean;

  private constructor(private readonly key: string, readonly curve: LatencyCurve | undefined,
    readonly route: RowRoute | undefined) {
    this.saved = curve !== undefined;
  }

  /** The store for `opened` at `threads`, with the curve an earlier visit kept (null without Web Crypto). */
  static async open(opened: PickedFolderSource | UrlSource, threads: number): Promise<CurveStore | null> {
    if (typeof crypto?.subtle === 'undefined') return null;
    const digest = await manifestDigest(await opened.readText('manifest.json')).catch(() => null);
    if (digest === null) return null;
    const key = `specmemo curve ${opened.where} ${threads} ${digest}`;
    const kept = CurveStore.read(key);
    return new CurveStore(key, kept.curve, kept.route);
  }

  private static read(key: string): { curve?: LatencyCurve; route?: RowRoute } {
    try {
      const kept = (JSON.parse(localStorage.getItem(key) ?? 'null') ?? {}) as { sizes?: unknown; stepMs?: unknown; route?: unknown };
      const route = kept.route as RowRoute | undefined;
      return {
        curve: numbers(kept.sizes) && numbers(kept.stepMs) ? new LatencyCurve(kept.sizes, kept.stepMs) : undefined,
        route: route && Number.isInteger(route.minRows) && route.minRows >= 1 && Number.isInteger(route.multiple) ? route : undefined,
      };
    } catch {
      return {}; // none, or not ours: measured again
    }
  }

  private write(entry: object): void {
    try {
      const kept = (JSON.parse(localStorage.getItem(this.key) ?? 'null') ?? {}) as object;
      localStorage.setItem(this.key, JSON.stringify({ ...kept, ...entry }));
    } catch {
      // storage full or refused: measured again next visit
    }
  }

  /** Keep the route the engine probed (or was handed) at open. */
  keepRoute(route: RowRoute): void {
    if (this.route === undefined) this.write({ route: { minRows: route.minRows, multiple: route.multiple } });
  }

  /** Keep `curve` once (the first reply in auto mode measured it). */
  keep(curve: LatencyCurve | null): void {
    if (this.saved || !curve) return;
    this.write({ sizes: curve.sizes, stepMs: curve.stepMs });
    this.saved = true;
  }
}
