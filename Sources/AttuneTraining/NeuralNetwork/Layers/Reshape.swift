// Reshape (Core ML `reshape`, CHANNEL_FIRST order).
//
//   x [B, C, H, W] → y [B, C', H', W']     with C·H·W = C'·H'·W'
//
// CHANNEL_FIRST reshaping reinterprets each sample's row-major C, H, W values in the new shape, which is how
// samples are laid out already, so both passes are copies: y = x and dx = dy.
enum ReshapeLayer {
    static func forward(x: UnsafePointer<Float>, y: UnsafeMutablePointer<Float>, count n: Int) {
        y.update(from: x, count: n)
    }

    static func backward(dy: UnsafePointer<Float>, dx: UnsafeMutablePointer<Float>, count n: Int) {
        dx.update(from: dy, count: n)
    }
}
