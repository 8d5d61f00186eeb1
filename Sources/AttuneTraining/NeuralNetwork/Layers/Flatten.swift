// Flatten (Core ML `flatten`, CHANNEL_FIRST order, or CHANNEL_LAST when H = W = 1).
//
//   x [B, C, H, W] → y [B, C·H·W]
//
// Samples are kept row-major in C, H, W order, which is exactly CHANNEL_FIRST flattening, so both passes
// are copies: y = x and dx = dy.
enum FlattenLayer {
    static func forward(x: UnsafePointer<Float>, y: UnsafeMutablePointer<Float>, count n: Int) {
        y.update(from: x, count: n)
    }

    static func backward(dy: UnsafePointer<Float>, dx: UnsafeMutablePointer<Float>, count n: Int) {
        dx.update(from: dy, count: n)
    }
}
