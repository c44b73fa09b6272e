// The binary attention slice of a head (api.js's getAttentionBin): its cells row-major by query,
// a causal row holding i+1 keys, every head of a layer one after another.

// Row i of one head as a Float32Array of its visible keys.
export function rowOf(slice, i, head = 0) {
  const { n, causal, data } = slice;
  const perHead = causal ? (n * (n + 1)) / 2 : n * n;
  const start = head * perHead + (causal ? (i * (i + 1)) / 2 : i * n);
  return data.subarray(start, start + (causal ? i + 1 : n));
}
