/**
 * The memory model in the browser: what a plan costs the tab, checked before anything large is fetched. The
 * prices are the engine's memory model (engine/src/memory.ts: the Python runtime's formulas, term for term):
 *
 *   need(C)      = footprint(C, the engine's R and T_max).total: load + generation (arena + activations
 *                  + step overhead) + headroom;
 *   lower bound  = lowerBound(context = MIN_CAPACITY).total: the smallest footprint that decodes speculatively
 *                  with a useful tree over MIN_CAPACITY tokens, what `specmemo plan` calls the lower bound;
 *   budget       = ?budget=<MiB>, else DEVICE_SHARE of what navigator.deviceMemory reports (a tab shares
 *                  the device with everything else); unknown without either, and then nothing is refused.
 *
 * Under the lower bound the page refuses in one line with both figures; between need(MIN_CAPACITY) and
 * need(the default C) it opens with the largest C that fits (the engine's largestCapacity: the Python plan's rule,
 * plan.largest_capacity) and says so. The page varies C only (R and T_max
 * are the engine's), so a budget over the lower bound but under need(MIN_CAPACITY) is refused as well, naming
 * both figures.
 */
import {
  drafterNames, footprint, largestCapacity, lowerBound, makeSizes, parseManifest, resolveSizes, type Calibration, type DrafterName,
  type Footprint, type Manifest, type Mode,
} from '@specmemo/engine';

import type { PickedFolderSource, UrlSource } from './sources';

export const DEVICE_SHARE = 0.5;
export const MIN_CAPACITY = 256;
const MIB = 2 ** 20;

export interface PagePlan {
  budget: number | null; // bytes
  files: number; // bytes of the artifact's files the engine loads
  capacity: number; // C the page opens with
  need: number; // the footprint's total at `capacity` with the engine's R and T_max
  lowerBound: number; // the lower bound's total over MIN_CAPACITY tokens (engine lowerBound)
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

/**
 * The calibration the page prices with. The Python runtime measures load and step overhead once per machine;
 * a page has no process to measure, so it stands in what it knows: load = the bytes of the files the engine
 * loads (held once, in the WebAssembly heap: the graphs' weights), step overhead = 0 (ORT's run state and the
 * like are left to the headroom).
 */
export function pageCalibration(files: number): Calibration {
  return { loadBytes: files, stepOverheadBytes: 0, baseBytes: 0 };
}

const mib = (bytes: number): string => `${(bytes / MIB).toFixed(0)} MiB`;

/** "files + generation + headroom" of a footprint whose load is the files. */
const parts = (f: Footprint): string =>
  `files ${mib(f.load)} + generation ${mib(f.generation)} + headroom ${mib(f.headroom)}`;

/** Why a budget under `least` is refused: the lower bound itself, or the plan the page opens at MIN_CAPACITY. */
function refusal(bound: Footprint, atLowest: Footprint, budget: number, smaller: string): string {
  const why = bound.total >= atLowest.total
    ? `its lower bound over ${bound.sizes.capacity} tokens with a ${bound.sizes.tree}-node tree: ${parts(bound)}`
    : `at C=${atLowest.sizes.capacity} with R=${atLowest.sizes.rows}, T_max=${atLowest.sizes.tree}: ${parts(atLowest)}; ` +
      `its lower bound is ${mib(bound.total)}`;
  return `this model needs at least ${mib(Math.max(bound.total, atLowest.total))} (${why}) and this device gives ` +
    `the page ${mib(budget)}: open ${smaller}, or raise ?budget= if the device has more`;
}

/** `drafters`: what the engine will run (engine.drafterNames), which sets R and T_max. */
export function pagePlan(m: Manifest, { files, budget, drafters, capacity }: {
  files: number; budget: number | null; drafters: readonly DrafterName[]; capacity?: number;
}): PagePlan {
  const calibration = pageCalibration(files);
  const sizes = resolveSizes(m, drafters, capacity);
  const at = (c: number): Footprint => footprint(m, calibration, makeSizes(c, sizes.rows, sizes.tree));
  const lowest = Math.min(MIN_CAPACITY, sizes.capacity);
  const bound = lowerBound(m, calibration, { context: lowest });
  const atLowest = at(lowest);
  let chosen = sizes.capacity;
  if (budget !== null && at(chosen).total > budget) {
    chosen = Math.max(lowest, Math.min(sizes.capacity, largestCapacity(m, calibration, budget, sizes)));
  }
  const need = at(chosen);
  const plan = { budget, files, capacity: chosen, need: need.total, lowerBound: bound.total, lowered: chosen < sizes.capacity };
  const smaller = m.weight_dtype === 'int4' ? 'a smaller model' : 'a smaller artifact (export --dtype int4)';
  if (budget !== null && Math.max(bound.total, atLowest.total) > budget) {
    return { ...plan, fits: false, text: refusal(bound, atLowest, budget, smaller) };
  }
  const budgetText = budget === null ? 'no budget known' : `budget ${mib(budget)}`;
  const text = `C=${chosen}: ${mib(need.total)} (${parts(need)}); lower bound ${mib(bound.total)}; ${budgetText}` +
    (plan.lowered ? `; C lowered from ${sizes.capacity} to fit` : '');
  return { ...plan, fits: true, text };
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
