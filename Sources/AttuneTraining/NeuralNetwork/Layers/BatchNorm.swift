import Foundation

// Batch normalization with the stored inference statistics (Core ML `batchnorm`, frozen), per channel:
//
//   x, y, dy, dx  [B, C, H, W]
//   y  = γ_c · (x − μ_c) / √(σ²_c + ε) + β_c  =  scale_c · x + shift_c
//   dx = scale_c · dy
//
// scale and shift are folded once, in Double, when the model is compiled; the layer never trains, so its
// parameters stay out of the flat parameter buffer.
struct BatchNormLayer: Sendable {
    let name: String
    let channels: Int
    /// H·W: the values of one channel in one sample.
    let planeSize: Int
    let scale: [Float]
    let shift: [Float]

    init(name: String, planeSize: Int, gamma: [Float], beta: [Float], mean: [Float], variance: [Float],
         epsilon: Float) {
        self.name = name
        channels = gamma.count
        self.planeSize = planeSize
        var scale: [Float] = [], shift: [Float] = []
        for c in 0..<gamma.count {
            let s = Double(gamma[c]) / (Double(variance[c]) + Double(epsilon)).squareRoot()
            scale.append(Float(s))
            shift.append(Float(Double(beta[c]) - Double(mean[c]) * s))
        }
        self.scale = scale
        self.shift = shift
    }

    func forward(x: UnsafePointer<Float>, y: UnsafeMutablePointer<Float>, batch: Int) {
        for plane in 0..<(batch * channels) {
            let c = plane % channels, s = scale[c], b = shift[c]
            let xp = x + plane * planeSize, yp = y + plane * planeSize
            for i in 0..<planeSize { yp[i] = s * xp[i] + b }
        }
    }

    func backward(dy: UnsafePointer<Float>, dx: UnsafeMutablePointer<Float>, batch: Int) {
        for plane in 0..<(batch * channels) {
            let s = scale[plane % channels]
            let dyp = dy + plane * planeSize, dxp = dx + plane * planeSize
            for i in 0..<planeSize { dxp[i] = s * dyp[i] }
        }
    }
}
