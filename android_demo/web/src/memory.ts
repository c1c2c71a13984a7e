/**
 * The memory model in the browser: what a plan costs the tab, checked before anything large is fetched. The plan is
 * `specmemo plan --budget`'s (the engine's fit, runtime/plan.py fit step for step) over the engine's memory model
 * (engine/src/memory.ts: the Python runtime's formulas, term for term):
 *
 *   budget   = ?budget=<MiB>, else DEVICE_SHARE of what navigator.deviceMemory reports (a tab shares the device
 *              with everything else); unknown without either, and then the engine's default sizes open unpriced;
 *   plan     = fit(budget, context = ?capacity= or the graph's max): the drafters' tree and the prefill chunk if
 *              they fit, cut down otherwise, then the context (or the largest C that fits);
 *   refusal  = a budget below the lower bound for that context, in one line naming both figures, before a graph
 *              loads (a smaller ?capacity= lowers the bound).
 */
import {
  decoderGraph, drafterNames, fit, footprint, parseManifest, resolveSizes, type Calibration, type DrafterName, type Footprint,
  type Manifest, type Mode, type Sizes,
} from '@specmemo/engine';

import type { PickedFolderSource, UrlSource } from './sources';

export const DEVICE_SHARE = 0.5; // of the device's reported memory, the page's budget when none is given
const MIB = 2 ** 20;

export interface PagePlan {
  budget: number | null; // bytes
  files: number; // bytes of the artifact's files the engine loads
  capacity: number; // C the page opens with
  sizes: Sizes; // C, R and T_max the engine opens with
  need: number; // the footprint's total at `sizes`
  fits: boolean;
  lowered: boolean; // sizes below the engine's defaults, to fit the budget
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

/** The files the engine loads whole: the decoder and its data, the heads' or the feature drafter's graph when drafting
 * with them. */
export function loadedFiles(m: Manifest, drafters: readonly DrafterName[]): string[] {
  const files = [decoderGraph(m, 'onnx'), m.decoder_data_file];
  if (drafters.includes('medusa') && m.heads !== null) {
    files.push(m.heads.file, m.heads.data_file, ...(m.heads.shared_lm_head ? [m.heads.shared_lm_head.file] : []));
  }
  if (drafters.includes('feature') && m.feature_drafter !== null) files.push(m.feature_drafter.file, m.feature_drafter.data_file);
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

/** `drafters`: what the engine will run (engine.drafterNames), which sets R and T_max. */
export function pagePlan(m: Manifest, { files, budget, drafters, capacity }: {
  files: number; budget: number | null; drafters: readonly DrafterName[]; capacity?: number;
}): PagePlan {
  const calibration = pageCalibration(files);
  const defaults = resolveSizes(m, drafters, capacity);
  if (budget === null) {
    const need = footprint(m, calibration, defaults);
    return { budget, files, capacity: defaults.capacity, sizes: defaults, need: need.total, fits: true, lowered: false,
      text: `C=${defaults.capacity}: ${mib(need.total)} (${parts(need)}); no budget known` };
  }
  let planned: Footprint;
  try {
    planned = fit(m, calibration, { budget, context: capacity, tree: defaults.tree });
  } catch (error) {
    const smaller = m.weight_dtype === 'int4' ? 'a smaller model' : 'a smaller artifact (export --dtype int4)';
    return { budget, files, capacity: defaults.capacity, sizes: defaults, need: 0, fits: false, lowered: false,
      text: `${(error as Error).message.replace(/: raise the budget.*$/, '')}, and this device gives the page ${mib(budget)}: ` +
        `open ${smaller}, a smaller ?capacity=, or raise ?budget= if the device has more` };
  }
  const s = planned.sizes;
  const lowered = s.capacity < defaults.capacity || s.rows < defaults.rows || s.tree < defaults.tree;
  const text = `C=${s.capacity} R=${s.rows} T_max=${s.tree}: ${mib(planned.total)} (${parts(planned)}); budget ${mib(budget)}` +
    (lowered ? `; lowered from C=${defaults.capacity} R=${defaults.rows} T_max=${defaults.tree} to fit` : '');
  return { budget, files, capacity: s.capacity, sizes: s, need: planned.total, fits: true, lowered, text };
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
