public import Foundation

/// Turns the PNG or JPEG bytes of a job's image feature into the model's input tensor, as Core ML's
/// `MLFeatureValue(cgImage:constraint:)` followed by the network's preprocessing scaler would:
///
/// 1. decode (PNG or JPEG, by signature) to 8-bit samples;
/// 2. drop alpha by compositing on black (each colour sample times alpha/255), as drawing the image
///    into a cleared, premultiplied BGRA buffer and ignoring its alpha does;
/// 3. convert to the constraint's colour space: gray = 0.299 R + 0.587 G + 0.114 B; a gray image
///    feeding an RGB/BGR input repeats its one value in all three channels;
/// 4. scale the whole image to the constraint's width × height, ignoring aspect ratio (Vision's "scale
///    fill" crop-and-scale option: nothing cropped, nothing padded), with the filter in `Resampler`.
///    Apple's documentation does not state which option `MLFeatureValue` uses when none is given;
///    this is the one that keeps every pixel, and producers who care send the model's aspect ratio;
/// 5. apply the scaler, `channelScale · x + bias`, x on the 0…255 scale.
///
/// Colour conversion happens while resampling, one source row at a time, so a large photo costs its
/// 8-bit samples plus one float band of the target's width per channel.
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
        var out: [Float] = []
        out.reserveCapacity(constraint.count)
        for (channel, bias) in zip(channels(of: image, in: constraint.colorSpace), scaler.biases(for: constraint.colorSpace)) {
            let plane = image.samples.withUnsafeBufferPointer { samples in
                resampler.resize { y, row in channel.fill(&row, y: y, of: image, samples) }
            }
            out.append(contentsOf: plane.map { scaler.channelScale * $0 + bias })
        }
        return out
    }

    /// Where each of the tensor's channels comes from.
    enum Channel {
        /// One of the source's channels (0 for gray; 0, 1, 2 for R, G, B).
        case source(Int)
        /// 0.299 R + 0.587 G + 0.114 B of a colour source.
        case luma

        /// Writes row `y` of this channel on the 0…255 scale, composited on black.
        func fill(_ row: inout [Float], y: Int, of image: DecodedImage, _ samples: UnsafeBufferPointer<UInt8>) {
            let stride = image.channels, alpha = stride - 1, hasAlpha = image.hasAlpha
            var p = y * image.width * stride
            for x in 0..<image.width {
                var value: Float
                switch self {
                case .source(let c): value = Float(samples[p + c])
                case .luma: value = 0.299 * Float(samples[p]) + 0.587 * Float(samples[p + 1]) + 0.114 * Float(samples[p + 2])
                }
                if hasAlpha { value *= Float(samples[p + alpha]) / 255 }
                row[x] = value
                p += stride
            }
        }
    }

    static func channels(of image: DecodedImage, in colorSpace: ImageConstraint.ColorSpace) -> [Channel] {
        switch (colorSpace, image.isColor) {
        case (.grayscale, false): return [.source(0)]
        case (.grayscale, true): return [.luma]
        case (.rgb, true): return [.source(0), .source(1), .source(2)]
        case (.bgr, true): return [.source(2), .source(1), .source(0)]
        case (.rgb, false), (.bgr, false): return [.source(0), .source(0), .source(0)]
        }
    }
}
