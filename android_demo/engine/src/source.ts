/**
 * Where an artifact's files come from. Each platform brings its own: Node reads the folder with fs
 * (node.ts), the web page fetches a URL or reads a picked folder, the React Native app reads the
 * app's files directory. The engine asks for nothing else.
 */

export interface GraphInput {
  /** A path (Node, React Native: ORT opens it and its external data beside it) or the model's bytes (web). */
  model: string | Uint8Array;
  /** With bytes: the external data files the graph names, by the name it gives them. */
  externalData?: { path: string; data: Uint8Array | string }[];
}

export interface ArtifactSource {
  readonly where: string; // for messages: a folder or URL
  readText(file: string): Promise<string>;
  /** Bytes [offset, offset + length) of a file; fewer only where the file ends. */
  readBytes(file: string, offset: number, length: number): Promise<Uint8Array>;
  /** What InferenceSession.create takes for `file`, whose weights lie in `dataFiles`. */
  graph(file: string, dataFiles: readonly string[]): Promise<GraphInput>;
}
