/** Vite's `?url` imports: the URL the built page serves the file at. */
declare module '*?url' {
  const url: string;
  export default url;
}
