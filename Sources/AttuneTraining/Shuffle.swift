// The deterministic shuffle of the training samples, specified exactly so other languages (the NumPy
// reference in Tests/python) reproduce it bit for bit.
//
// SplitMix64 (Steele, Lea, Flood 2014), all arithmetic modulo 2^64:
//   state ← state + 0x9E3779B97F4A7C15
//   z ← state
//   z ← (z ⊕ (z >> 30)) · 0xBF58476D1CE4E5B9
//   z ← (z ⊕ (z >> 27)) · 0x94D049BB133111EB
//   return z ⊕ (z >> 31)
// seeded with the task's seed (an Int64, reinterpreted as its two's-complement UInt64).
//
// The order starts as 0, 1, …, n−1. Before every epoch (when shuffle is on) the current order is
// permuted in place by Fisher–Yates from the back: for i = n−1 down to 1, j = next() mod (i+1), swap
// order[i] and order[j]. One generator serves the whole task, so epoch e's order depends on all draws
// before it. (The modulo bias, below n/2^64, is accepted to keep the rule simple.)
struct SplitMix64: Sendable {
    private(set) var state: UInt64

    init(seed: Int64) { state = UInt64(bitPattern: seed) }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

extension Array where Element == Int {
    mutating func fisherYatesShuffle(using generator: inout SplitMix64) {
        guard count > 1 else { return }
        for i in stride(from: count - 1, through: 1, by: -1) {
            let j = Int(generator.next() % UInt64(i + 1))
            swapAt(i, j)
        }
    }
}
