/** SpecMemo's runtime in TypeScript: the Python runtime's steps over onnxruntime-common. */

export { parseRoute } from './backend';
export { ChatSession } from './chat';
export type { Reply, SendOptions, Turn } from './chat';
export { Controller, LatencyCurve, measureLatency } from './controller';
export { accept, generate, prefill, verifyAndCommit, FullWidth } from './decode';
export type { Generation, GenerationStats, WidthPolicy } from './decode';
export { DraftTree, Merged, merge, ordered } from './drafters/draft';
export { PromptLookup } from './drafters/lookup';
export { MedusaDrafter } from './drafters/medusa';
export { parseDrafter } from './drafters/names';
export type { DrafterName } from './drafters/names';
export { Engine, drafterNames, openEngine } from './engine';
export type { EngineOptions, GenerateRequest, MemoryPlan, Mode } from './engine';
export { ArtifactError, ConfigError, ContextOverflowError } from './errors';
export { ManifestError, manifestRoute, parseManifest } from './manifest';
export type { FeatureDrafterInfo, Manifest, ModelFormat, RowRoute } from './manifest';
export { Arena, allocationBytes, kvBytes, layoutFor, views } from './arena';
export { MedusaTree, USEFUL_GAIN } from './medusaTree';
export { HEADROOM, activationBytes, footprint, lowerBound, pricedLayout } from './memory';
export type { Calibration, Footprint } from './memory';
export { makeSizes, resolveSizes, usefulTreeSize } from './sizes';
export type { Sizes } from './sizes';
export type { ArtifactSource, GraphInput } from './source';
export type { OrtModule } from './session';
export { ChatTokenizer } from './tokenizer';
export type { Message } from './tokenizer';
export { chain, depths, treeBias } from './tree';
