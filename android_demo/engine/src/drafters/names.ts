/** Drafter names, as --drafter spells them (runtime/drafters/__init__.py), and the drafters' table both engines read
 * (shared.json `drafters`, runtime/drafters/registry.py): what each needs from the artifact, the tree it can fill. */

import { ConfigError } from '../errors';
import { SHARED } from '../shared';

export type DrafterName = 'medusa' | 'lookup' | 'feature' | 'recall';

/** One row of the table (registry.py DrafterKind): the fields this engine reads. */
export interface DrafterKind {
  name: DrafterName;
  part: 'heads' | 'feature_drafter' | null; // the manifest's field holding what it drafts with; null: nothing exported
  needs: string; // what the part is, for messages
  exportFlag: string | null; // the export option that writes the part
  maxTree: number | null; // T_max it can use; null: the exported Medusa tree
}

type Row = (typeof SHARED.drafters)[number];

/** A row's T_max (registry.py _max_tree): null (the exported Medusa tree), or its nodes (its own number, or the shared
 * number it names), plus the root where it counts nodes after the root. */
function maxTree(row: Row): number | null {
  const spec = row.max_tree as { nodes?: number; from?: string; root: boolean } | null;
  if (spec === null) return null;
  const [section, key] = (spec.from ?? '.').split('.');
  const nodes = spec.nodes ?? (SHARED as unknown as Record<string, Record<string, number>>)[section][key];
  return nodes + (spec.root ? 1 : 0);
}

// the rows this engine runs (`device`: the draft model runs in the Python runtime only)
const ROWS = SHARED.drafters.filter((row) => row.device);
export const DRAFTERS: ReadonlyMap<DrafterName, DrafterKind> = new Map(ROWS.map((row) => [
  row.name as DrafterName,
  { name: row.name as DrafterName, part: row.part as DrafterKind['part'], needs: row.needs, exportFlag: row.export_flag, maxTree: maxTree(row) },
]));
const NAMES = [...DRAFTERS.keys()];

/** 'medusa+lookup' → ['medusa', 'lookup']; a one-line error naming the choices otherwise. */
export function parseDrafter(spec: string): DrafterName[] {
  const names: DrafterName[] = [];
  for (const part of spec.split('+').map((p) => p.trim())) {
    if (!(NAMES as readonly string[]).includes(part)) {
      throw new ConfigError(`unknown drafter ${JSON.stringify(part)} in ${JSON.stringify(spec)}: use one of ${NAMES.join(', ')} or several joined by '+'`);
    }
    if (names.includes(part as DrafterName)) throw new ConfigError(`drafter ${JSON.stringify(part)} is named twice in ${JSON.stringify(spec)}`);
    names.push(part as DrafterName);
  }
  return names;
}

/** `names` with the recall drafter merged in (runtime/drafters/__init__.py with_recall), for an engine given a store. */
export function withRecall(names: readonly DrafterName[]): DrafterName[] {
  return names.includes('recall') ? [...names] : [...names, 'recall'];
}
