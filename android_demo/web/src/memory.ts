/**
 * The memory model in the browser: what a plan costs the tab, checked before anything large is fetched.
 *
 *   need(C)      = the artifact's files the engine loads (held once, in the WebAssembly heap: the graphs'
 *                  weights) + the arena at C (the engine's own layout, byte for byte: KV + step I/O);
 *   lower bound  = need(MIN_CAPACITY): the least this model runs in;
 *   budget       = ?budget=<MiB>, else DEVICE_SHARE of what navigator.deviceMemory reports (a tab shares
 *                  the device with everything else); unknown without either, and then nothing is refused.
 *
 * Under the lower bound the page refuses in one line with both figures; between it and need(the default
 * C) it opens with the largest C that fits and says so.
 */
import {
  allocationBytes, drafterNames, layoutFor, makeSizes, parseManifest, resolveSizes, type DrafterName, type Manifest,
  type Mode,
} from '@specmemo/engine';

import type { PickedFolderSource, UrlSource } from './sources';

export const DEVICE_SHARE = 0.5;
export const MIN_CAPACITY = 256;
export const CAPACITY_STEP = 64;
const MIB = 2 ** 20;

export interface PagePlan {
  budget: number | null; // bytes
  files: number; // bytes of the artifact's files the engine loads
  capacity: number; // C the page opens with
  need: number; // files + arena at `capacity`
  lowerBound: number; // files + arena at MIN_CAPACITY
  fits: boolean;
  lowered: boolean; // C below the artifact's default, to fit the budget
  text: string;
}

/** The budget in bytes: ?budget=<MiB>, else a share of the device's reported memory; null when unknown. */
export function budgetBytes(param: string | null, deviceMemoryGiB: number | undefined): number | null {
  if (param !== null && param !== '') {
    const mib = Number(param);
    if (!(mib > 0)) throw new Error(`?budget=${param}: expected MiB > 0`);
    return mib * MIB;
  }
  return deviceMemoryGiB ? deviceMemoryGiB * 2 ** 30 * DEVICE_SHARE : null;
}

/** The files the engine loads whole: the decoder and its data, the heads graph when drafting with them. */
export function loadedFiles(m: Manifest, drafters: readonly DrafterName[]): string[] {
  const files = [m.decoder_file, m.decoder_data_file];
  if (drafters.includes('medusa') && m.heads !== null) {
    files.push(m.heads.file, m.heads.data_file, ...(m.heads.shared_lm_head ? [m.heads.shared_lm_head.file] : []));
  }
  if (m.embedding.file !== m.decoder_data_file) files.push(m.embedding.file); // its own file: float32 rows, or GGUF blocks
  return [...new Set(files)];
}

function arenaAt(m: Manifest, capacity: number, rows: number, tree: number, withHeads: boolean): number {
  return allocationBytes(layoutFor(m, makeSizes(capacity, rows, tree), withHeads));
}

/** `drafters`: what the engine will run (engine.drafterNames), which sets T_max and whether heads I/O is in the
 * arena. */
export function pagePlan(m: Manifest, { files, budget, drafters, capacity }: {
  files: number; budget: number | null; drafters: readonly DrafterName[]; capacity?: number;
}): PagePlan {
  const withHeads = drafters.includes('medusa');
  const sizes = resolveSizes(m, drafters, capacity);
  const at = (c: number) => files + arenaAt(m, c, sizes.rows, sizes.tree, withHeads);
  const lowest = Math.min(MIN_CAPACITY, sizes.capacity);
  const lowerBound = at(lowest);
  let chosen = sizes.capacity;
  if (budget !== null && at(chosen) > budget) {
    chosen = lowest;
    for (let c = lowest + CAPACITY_STEP; c < sizes.capacity && at(c) <= budget; c += CAPACITY_STEP) chosen = c;
  }
  const fits = budget === null || lowerBound <= budget;
  const mib = (b: number) => `${(b / MIB).toFixed(0)} MiB`;
  const smaller = m.weight_dtype === 'int4' ? 'a smaller model' : 'a smaller artifact (export --dtype int4)';
  const budgetText = budget === null ? 'no budget known' : `budget ${mib(budget)}`;
  const text = fits
    ? `C=${chosen}: ${mib(at(chosen))} (files ${mib(files)} + arena ${mib(at(chosen) - files)}); ${budgetText}` +
      (chosen < sizes.capacity ? `; C lowered from ${sizes.capacity} to fit` : '')
    : `this model needs at least ${mib(lowerBound)} (its files ${mib(files)} + the arena at C=${lowest}) and this ` +
      `device gives the page ${mib(budget!)}: open ${smaller}, or raise ?budget= if the device has more`;
  return { budget, files, capacity: chosen, need: at(chosen), lowerBound, fits, lowered: chosen < sizes.capacity, text };
}

/** The plan for an artifact before its graphs load: its manifest, the drafters the engine will run
 * (engine.drafterNames, as openEngine decides them) and the sizes of the files they load. */
export async function planSource(source: PickedFolderSource | UrlSource, { mode, drafter, budget, capacity }: {
  mode: Mode; drafter?: string; budget: number | null; capacity?: number;
}): Promise<PagePlan> {
  const m = parseManifest(await source.readText('manifest.json'), `${source.where}/manifest.json`);
  const drafters = drafterNames(mode, drafter, m);
  const sizes = await Promise.all(loadedFiles(m, drafters).map((f) => source.size(f)));
  return pagePlan(m, { files: sizes.reduce<number>((sum, n) => sum + (n ?? 0), 0), budget, drafters, capacity });
}

/** A failed allocation said as the memory model would: what the plan needed. */
export function allocationMessage(error: unknown, plan: PagePlan | null): unknown {
  const text = error instanceof Error ? error.message : String(error);
  if (plan === null || !/memory|allocat|RangeError/i.test(text)) return error;
  return new Error(`the browser could not allocate the model (${text.split('\n')[0]}): the plan needed ` +
    `${(plan.need / MIB).toFixed(0)} MiB (${plan.text}); try ?capacity=${Math.max(64, Math.floor(plan.capacity / 2))} ` +
    `or a smaller artifact`);
}
