/** Errors a caller can act on; each message is one line that names the fix. */

export class ConfigError extends Error {
  override name = 'ConfigError';
}

/** The tokens to run do not fit in the KV capacity. */
export class ContextOverflowError extends RangeError {
  override name = 'ContextOverflowError';
}

/** A graph cannot be loaded, or does not match its manifest. */
export class ArtifactError extends Error {
  override name = 'ArtifactError';
}
