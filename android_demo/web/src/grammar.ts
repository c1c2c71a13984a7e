/** The grammar engine for JSON replies (the engine's constraint.ts), as the page loads it. */
import type { XGrammar } from '@specmemo/engine';

/**
 * xgrammar's WebAssembly build, loaded on the first JSON reply (about 1 MB). Its package is a UMD bundle: as an ES
 * module it sets `globalThis.xgrammar` rather than exporting.
 */
export async function loadGrammar(): Promise<XGrammar> {
  const loaded = (await import('@mlc-ai/web-xgrammar')) as unknown as Partial<XGrammar>;
  const module = loaded.GrammarCompiler ? loaded : (globalThis as unknown as { xgrammar?: XGrammar }).xgrammar;
  if (!module?.GrammarCompiler) throw new Error('the grammar engine (@mlc-ai/web-xgrammar) did not load');
  return module as XGrammar;
}
