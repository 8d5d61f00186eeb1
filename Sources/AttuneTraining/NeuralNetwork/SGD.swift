// Stochastic gradient descent with momentum, in the convention of Core ML and PyTorch's "Nesterov off"
// variant written with the learning rate inside the velocity:
//
//   v ← momentum · v − learningRate · g
//   w ← w + v
//
// The velocity starts at zero for every update task (it is not part of the stored update state), so a
// task's result depends only on its inputs. With momentum 0 this is plain SGD: w ← w − learningRate · g.
// A learning-rate schedule changes `learningRate` between epochs; the velocity carries on, as it does
// on a device across resume(withParameters:).
final class SGD: OptimizerStep {
    var learningRate: Float
    let momentum: Float
    let velocity: FloatBuffer
    let split: RangeSplit

    init(learningRate: Double, momentum: Double, slots: [TensorSlot], parameterCount: Int) {
        self.learningRate = Float(learningRate)
        self.momentum = Float(momentum)
        velocity = FloatBuffer(count: parameterCount)
        split = RangeSplit(slots.map { $0.offset..<($0.offset + $0.count) })
    }

    func beginStep() {}

    /// Eight values at a time where eight remain (the same float operations per value, so the same bits):
    /// the compiler cannot vectorize the plain loop, since it cannot tell that the buffers do not overlap.
    func update(_ ranges: [Range<Int>], params: UnsafeMutablePointer<Float>, grads: Gradient) {
        let v = velocity.pointer
        let m = Lanes(repeating: momentum), lr = Lanes(repeating: learningRate)
        for range in ranges {
            var i = range.lowerBound
            while i + 8 <= range.upperBound {
                let velocity = m * load(v + i) - lr * grads.lanes(i)
                store(velocity, v + i)
                store(load(params + i) + velocity, params + i)
                i += 8
            }
            while i < range.upperBound {
                v[i] = momentum * v[i] - learningRate * grads[i]
                params[i] += v[i]
                i += 1
            }
        }
    }
}

/// One optimizer step over the trainable ranges of the flat parameter buffer, given the gradients of a
/// mini-batch; the optimizer keeps whatever state it needs (velocity, moments) between steps. A step is
/// `beginStep` and then `update` over every trainable range exactly once, in any cut: each value is
/// updated from its own gradient and state alone (`step` cuts them by `split`; a split mini-batch's first
/// layer is updated by each thread's outputs, `FirstLayerSplit`).
protocol OptimizerStep: AnyObject {
    /// Set before each epoch from the task's schedule (float32, as the per-value arithmetic is).
    var learningRate: Float { get set }
    /// The trainable ranges, cut into the parts `step` runs in parallel.
    var split: RangeSplit { get }
    /// Once per mini-batch, before its updates (Adam counts its steps here).
    func beginStep()
    func update(_ ranges: [Range<Int>], params: UnsafeMutablePointer<Float>, grads: Gradient)
}

extension OptimizerStep {
    /// The whole step over every trainable range, for a mini-batch of `rows` rows: in `split`'s parts on
    /// the pool's threads when its products were split too (`RangeSplit.parts(rows:)`).
    func step(params: UnsafeMutablePointer<Float>, grads: Gradient, rows: Int) {
        beginStep()
        let parts = split.parts
        if split.parts(rows: rows) == 1 {
            for part in parts { update(part, params: params, grads: grads) }
            return
        }
        PartPool.shared.run(parts: parts.count) { self.update(parts[$0], params: params, grads: grads) }
    }
}

/// A mini-batch's gradient over the flat parameter buffer: `first`, plus the gradients of the mini-batch's
/// other parts when it was trained in parts (`BatchSplit`), added in part order as each value is read, so
/// the optimizer's one pass over the values also sums them.
struct Gradient {
    let first: UnsafePointer<Float>
    let others: [UnsafePointer<Float>]

    init(_ first: UnsafePointer<Float>, others: [UnsafePointer<Float>] = []) {
        self.first = first
        self.others = others
    }

    @inline(__always)
    subscript(i: Int) -> Float {
        var g = first[i]
        for other in others { g += other[i] }
        return g
    }

    /// Values i..<i+8.
    @inline(__always)
    func lanes(_ i: Int) -> Lanes {
        var g = load(first + i)
        for other in others { g += load(other + i) }
        return g
    }
}

typealias Lanes = SIMD8<Float>

@inline(__always)
func load(_ p: UnsafePointer<Float>) -> Lanes { UnsafeRawPointer(p).loadUnaligned(as: Lanes.self) }

@inline(__always)
func load(_ p: UnsafeMutablePointer<Float>) -> Lanes { UnsafeRawPointer(p).loadUnaligned(as: Lanes.self) }

@inline(__always)
func store(_ v: Lanes, _ p: UnsafeMutablePointer<Float>) { UnsafeMutableRawPointer(p).storeBytes(of: v, as: Lanes.self) }
