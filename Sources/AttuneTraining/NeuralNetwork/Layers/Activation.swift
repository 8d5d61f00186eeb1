import Foundation

// Element-wise activations (Core ML `activation`). Shape is irrelevant: n = B · width elements.
//
//   x, y, dy, dx  [n]
//   relu        y = max(0, x)                 dx = dy · [x > 0]
//   leakyReLU   y = x if x ≥ 0 else α·x       dx = dy if x ≥ 0 else α·dy
//   sigmoid     y = 1 / (1 + e^−x)            dx = dy · y · (1 − y)
//   tanh        y = tanh x                    dx = dy · (1 − y²)
//   linear      y = α·x + β                   dx = α · dy
//
// ReLU's derivative at exactly 0 is taken as 0, leakyReLU's as 1 (Core ML's `x >= 0` branch).
struct ActivationLayer: Sendable {
    enum Kind: Sendable, Equatable {
        case relu
        case leakyReLU(alpha: Float)
        case sigmoid
        case tanh
        case linear(alpha: Float, beta: Float)
    }

    let name: String
    let kind: Kind

    func forward(x: UnsafePointer<Float>, y: UnsafeMutablePointer<Float>, count n: Int) {
        switch kind {
        case .relu:
            Self.relu(x, where: x, into: y, count: n)
        case .leakyReLU(let alpha):
            for i in 0..<n { y[i] = x[i] >= 0 ? x[i] : alpha * x[i] }
        case .sigmoid:
            for i in 0..<n { y[i] = 1 / (1 + Foundation.exp(-x[i])) }
        case .tanh:
            for i in 0..<n { y[i] = Foundation.tanh(x[i]) }
        case .linear(let alpha, let beta):
            for i in 0..<n { y[i] = alpha * x[i] + beta }
        }
    }

    func backward(x: UnsafePointer<Float>, y: UnsafePointer<Float>, dy: UnsafePointer<Float>,
                  dx: UnsafeMutablePointer<Float>, count n: Int) {
        switch kind {
        case .relu:
            Self.relu(dy, where: x, into: dx, count: n)
        case .leakyReLU(let alpha):
            for i in 0..<n { dx[i] = x[i] >= 0 ? dy[i] : alpha * dy[i] }
        case .sigmoid:
            for i in 0..<n { dx[i] = dy[i] * y[i] * (1 - y[i]) }
        case .tanh:
            for i in 0..<n { dx[i] = dy[i] * (1 - y[i] * y[i]) }
        case .linear(let alpha, _):
            for i in 0..<n { dx[i] = alpha * dy[i] }
        }
    }

    /// out[i] = x[i] > 0 ? values[i] : 0, eight at a time: written as a loop of selects the compiler keeps a
    /// branch per value, which the signs of real activations mispredict half the time.
    private static func relu(_ values: UnsafePointer<Float>, where x: UnsafePointer<Float>,
                             into out: UnsafeMutablePointer<Float>, count n: Int) {
        let whole = n / 8 * 8
        for i in stride(from: 0, to: whole, by: 8) {
            let v = UnsafeRawPointer(values + i).loadUnaligned(as: SIMD8<Float>.self)
            let sign = UnsafeRawPointer(x + i).loadUnaligned(as: SIMD8<Float>.self)
            UnsafeMutableRawPointer(out + i).storeBytes(of: SIMD8<Float>().replacing(with: v, where: sign .> 0),
                                                         as: SIMD8<Float>.self)
        }
        for i in whole..<n { out[i] = x[i] > 0 ? values[i] : 0 }
    }
}
