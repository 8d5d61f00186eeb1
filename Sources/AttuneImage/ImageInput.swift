import Foundation

/// Turns the PNG or JPEG bytes of a job's image feature into the model's input tensor, as Core ML's
/// `MLFeatureValue(cgImage:constraint:)` followed by the network's preprocessing scaler would:
///
/// 1. decode (PNG or JPEG, by signature) to 8-bit samples;
/// 2. drop alpha by compositing on black (each colour sample times alpha/255), which is what drawing a
///    translucent image into Core ML's premultiplied BGRA buffer and ignoring its alpha gives;
/// 3. convert to the constraint's colour space: gray = 0.299 R + 0.587 G + 0.114 B; a gray image
///    feeding an RGB/BGR input repeats its one value in all three channels;
/// 4. scale the whole image to the constraint's width × height, ignoring aspect ratio (the "scale fill"
///    crop-and-scale option: nothing is cropped, nothing padded), with the filter in `Resampler`;
/// 5. apply the scaler, `channelScale · x + bias`, x on the 0…255 scale.
///
/// The result is float32 in Core ML's channel-first order `[C, H, W]`: R, G, B planes for RGB,
/// B, G, R for BGR, one plane for grayscale.
public enum ImageInput {
    public static func tensor(from bytes: Data, constraint: ImageConstraint, scaler: ImageScaler?,
                              limits: ImageLimits = .standard) throws(ImageInputError) -> [Float] {
        let decoded = try bytes.withUnsafeBytes { raw -> Result<DecodedImage, ImageInputError> in
            do throws(ImageInputError) { return .success(try decodeImage(raw, limits: limits)) }
            catch { return .failure(error) }
        }.get()
        return tensor(from: decoded, constraint: constraint, scaler: scaler ?? .identity)
    }

    static func tensor(from image: DecodedImage, constraint: ImageConstraint, scaler: ImageScaler) -> [Float] {
        let resampler = Resampler(width: image.width, height: image.height,
                                  targetWidth: constraint.width, targetHeight: constraint.height)
        let biases = scaler.biases(for: constraint.colorSpace)
        var out: [Float] = []
        out.reserveCapacity(constraint.count)
        for (channel, plane) in planes(of: image, in: constraint.colorSpace).enumerated() {
            let bias = biases[channel]
            out.append(contentsOf: resampler.resize(plane).map { scaler.channelScale * $0 + bias })
        }
        return out
    }

    /// The image's channels in the colour space's order, each a `height × width` plane on the 0…255
    /// scale, alpha already composited on black.
    static func planes(of image: DecodedImage, in colorSpace: ImageConstraint.ColorSpace) -> [[Float]] {
        let count = image.width * image.height, stride = image.channels
        let samples = image.samples
        // Straight colour channels of the source, premultiplied by alpha.
        var source = [[Float]](repeating: [Float](repeating: 0, count: count), count: image.isColor ? 3 : 1)
        for p in 0..<count {
            let base = p * stride
            let coverage: Float = image.hasAlpha ? Float(samples[base + stride - 1]) / 255 : 1
            for c in source.indices { source[c][p] = Float(samples[base + c]) * coverage }
        }
        switch (colorSpace, image.isColor) {
        case (.grayscale, false): return source
        case (.grayscale, true):
            let (r, g, b) = (source[0], source[1], source[2])
            return [(0..<count).map { 0.299 * r[$0] + 0.587 * g[$0] + 0.114 * b[$0] }]
        case (.rgb, true): return source
        case (.bgr, true): return [source[2], source[1], source[0]]
        case (.rgb, false), (.bgr, false): return [source[0], source[0], source[0]]
        }
    }
}
