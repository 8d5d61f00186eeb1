// The sliding-window geometry convolution and pooling share, by Core ML's rules:
//
//   valid: out = floor((in − k) / s) + 1, no padding
//   same:  out = ceil(in / s); total padding p = max((out − 1)·s + k − in, 0);
//          top/left get floor(p / 2), bottom/right the rest (BOTTOM_RIGHT_HEAVY)

/// Height and width of one channel plane.
struct SpatialSize: Sendable, Equatable, CustomStringConvertible {
    let height: Int
    let width: Int

    var count: Int { height * width }
    var description: String { "\(height)×\(width)" }
}

enum WindowPadding: Sendable {
    case valid
    case same
}

/// Where a window of `kernel` cells moving by `stride` lands on an input along one axis.
struct WindowAxis: Sendable, Equatable {
    let output: Int
    /// Padding cells before the first input cell.
    let before: Int

    /// nil when the kernel does not fit a valid window.
    init?(input: Int, kernel: Int, stride: Int, padding: WindowPadding) {
        switch padding {
        case .valid:
            guard kernel <= input else { return nil }
            output = (input - kernel) / stride + 1
            before = 0
        case .same:
            output = (input + stride - 1) / stride
            before = max((output - 1) * stride + kernel - input, 0) / 2
        }
    }
}

/// Where the windows of a convolution or pooling layer lie on one channel plane.
struct WindowGeometry: Sendable {
    let kernel: SpatialSize
    let stride: SpatialSize
    let input: SpatialSize
    let output: SpatialSize
    /// Zero rows above and zero columns left of the image (the rest of the padding is implied by `output`).
    let padTop: Int
    let padLeft: Int
}

/// A layer that slides a window over each channel plane: its geometry, named as the inner loops use it.
protocol WindowedLayer {
    var geometry: WindowGeometry { get }
}

extension WindowedLayer {
    var kernelHeight: Int { geometry.kernel.height }
    var kernelWidth: Int { geometry.kernel.width }
    var strideHeight: Int { geometry.stride.height }
    var strideWidth: Int { geometry.stride.width }
    var input: SpatialSize { geometry.input }
    var output: SpatialSize { geometry.output }
    var padTop: Int { geometry.padTop }
    var padLeft: Int { geometry.padLeft }
}
